#include "kernels/cpu/linear_gguf.h"

#include <immintrin.h>

#include <cstring>

#include "base/check.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
int64_t gguf_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kGgufQ8_0: return 34;
    case WeightFormat::kGgufQ4_0: return 18;
    case WeightFormat::kGgufMxfp4: return 17;
    default: return 0;
  }
}

typedef int8_t v16i8 __attribute__((vector_size(16)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef int32_t v16i32 __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64), aligned(4)));

// Stores 16 int8 × scale as floats (int8 → int32 → float: GCC scalarises int8 → float directly).
inline void store16(const v16i8& q, float s, float* dst) {
  const v16f f = __builtin_convertvector(__builtin_convertvector(q, v16i32), v16f) * s;
  std::memcpy(dst, &f, 64);
}

// Plain loop: GCC vectorises it (int8 → float per element) better than the explicit vector form.
void decode_q8_0_row(const uint8_t* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 34, dst += 32) {
    const float d = gguf_load_f16(blocks);
    const int8_t* q = reinterpret_cast<const int8_t*>(blocks + 2);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

void decode_q4_0_row(const uint8_t* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 18, dst += 32) {
    const float d = gguf_load_f16(blocks);
    v16u8 qs;
    std::memcpy(&qs, blocks + 2, 16);
    const v16i8 lo = __builtin_convertvector(qs & 15, v16i8) - 8;  // elements 0..15
    const v16i8 hi = __builtin_convertvector(qs >> 4, v16i8) - 8;  // elements 16..31
    store16(lo, d, dst);
    store16(hi, d, dst + 16);
  }
}

// SSSE3: one pshufb maps 16 codes to 2·E2M1 integers; low nibbles are elements 0..15 and high nibbles
// 16..31, so no interleave is needed. int8 → int32 → float (GCC scalarises int8 → float directly).
void decode_gguf_mxfp4_row(const uint8_t* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 17, dst += 32) {
    const float s = gguf_e8m0_half(blocks[0]);
    const uint8_t* qs = blocks + 1;
#if defined(__SSSE3__)
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i nib = _mm_set1_epi8(15);
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kGgufE2M1Doubled));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nib));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), nib));
    v16i8 a, c;
    std::memcpy(&a, &lo, 16);
    std::memcpy(&c, &hi, 16);
    const v16f f1 = __builtin_convertvector(__builtin_convertvector(a, v16i32), v16f) * s;
    const v16f f2 = __builtin_convertvector(__builtin_convertvector(c, v16i32), v16f) * s;
    std::memcpy(dst, &f1, 64);
    std::memcpy(dst + 16, &f2, 64);
#else
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(kGgufE2M1Doubled[qs[j] & 15]) * s;
      dst[j + 16] = static_cast<float>(kGgufE2M1Doubled[qs[j] >> 4]) * s;
    }
#endif
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
