// GGUF (ggml) block-quantized weight rows, decoded from the mmap'd bytes in place. One row of a
// [out, in] matrix is in/32 consecutive blocks; rows follow each other (ggml ne = [in, out]).
//   Q8_0  (34 B): fp16 d | int8 q[32];            x[j] = d·q[j]
//   Q4_0  (18 B): fp16 d | u8 qs[16];             x[j] = d·((qs[j] & 15) − 8), x[j+16] = d·((qs[j] >> 4) − 8)
//   MXFP4 (17 B): u8 e (E8M0) | u8 qs[16];        x[j] = E2M1(qs[j] & 15)·2^(e−127), x[j+16] = E2M1(qs[j] >> 4)·…
// Values are exact (every decoded value is representable in fp32), so the decode matches ggml's own
// dequantize_row_* bit for bit. fp16 scales are read with memcpy (blocks are not 2-byte aligned).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {

inline constexpr int64_t kGgufBlock = 32;

// fp16 block scale at p (blocks are not 2-byte aligned: memcpy).
inline float gguf_load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// 2·E2M1 as integers (ggml's kvalues_mxfp4); a GGUF MXFP4 value is this × 2^(e−128).
alignas(16) inline constexpr int8_t kGgufE2M1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e−128) as ggml computes it (e < 2 gives the fp32 subnormals 2^-128, 2^-127; e = 255 gives 2^127).
inline float gguf_e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}
// Bytes per 32-element block of a GGUF weight format (0 for non-GGUF formats).
int64_t gguf_block_bytes(WeightFormat f);

void decode_q8_0_row(const uint8_t* blocks, int64_t n_blocks, float* dst);
void decode_q4_0_row(const uint8_t* blocks, int64_t n_blocks, float* dst);
void decode_gguf_mxfp4_row(const uint8_t* blocks, int64_t n_blocks, float* dst);

// Row r of a GGUF-format WeightMatrix (w.in a multiple of 32) into fp32.
void decode_gguf_row(const WeightMatrix& w, int64_t r, float* dst);

}  // namespace kestrel::kernels
