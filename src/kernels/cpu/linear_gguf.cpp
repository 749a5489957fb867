#include "kernels/cpu/linear_gguf.h"

#include <bit>
#include <cstring>

#include "base/check.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// 2·E2M1 as integers (ggml's kvalues_mxfp4); multiplied by 2^(e−128) below.
constexpr int8_t kE2M1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e−128) as ggml computes it (e < 2 gives the fp32 subnormals 2^-128, 2^-127; e = 255 gives 2^127).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

}  // namespace

int64_t gguf_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kGgufQ8_0: return 34;
    case WeightFormat::kGgufQ4_0: return 18;
    case WeightFormat::kGgufMxfp4: return 17;
    default: return 0;
  }
}

void decode_q8_0_row(const uint8_t* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 34, dst += 32) {
    const float d = load_f16(blocks);
    const int8_t* q = reinterpret_cast<const int8_t*>(blocks + 2);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

void decode_q4_0_row(const uint8_t* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 18, dst += 32) {
    const float d = load_f16(blocks);
    const uint8_t* qs = blocks + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 15) - 8);
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void decode_gguf_mxfp4_row(const uint8_t* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 17, dst += 32) {
    const float s = e8m0_half(blocks[0]);
    const uint8_t* qs = blocks + 1;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(kE2M1Doubled[qs[j] & 15]) * s;
      dst[j + 16] = static_cast<float>(kE2M1Doubled[qs[j] >> 4]) * s;
    }
  }
}

void decode_gguf_row(const WeightMatrix& w, int64_t r, float* dst) {
  KCHECK(w.in % kGgufBlock == 0, "GGUF block matrix with in not a multiple of 32 (the binder validates)");
  const int64_t nb = w.in / kGgufBlock;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * nb * gguf_block_bytes(w.format);
  switch (w.format) {
    case WeightFormat::kGgufQ8_0: return decode_q8_0_row(row, nb, dst);
    case WeightFormat::kGgufQ4_0: return decode_q4_0_row(row, nb, dst);
    case WeightFormat::kGgufMxfp4: return decode_gguf_mxfp4_row(row, nb, dst);
    default: KCHECK(false, "decode_gguf_row on a non-GGUF format");
  }
}

}  // namespace kestrel::kernels
