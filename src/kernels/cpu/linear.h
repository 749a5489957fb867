// Linear layers y = x W^T with weights kept in their checkpoint format (no fp32 copy).
//   W: [out, in] row-major, dtype F32 / BF16 / F16, or MXFP4 (compressed-tensors packing:
//      packed U8 [out, in/2], byte j = code(2j) | code(2j+1) << 4; scales E8M0 U8 [out, in/32]).
//   kW4A8: int4 pack-quantized (compressed-tensors): packed I32 [out, in/8] (element k at bit 4·(k%8)
//      of word k/8, stored as q+8), scales BF16 [out, in/group]; matmul quantizes x to int8 per token
//      (kernels/cpu/w4a8_gemm.h).
//   x: [T, in] fp32, y: [T, out] fp32. Accumulation fp32.
// Thread-safety: pure functions; parallel over output rows with OpenMP.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace kestrel::kernels {

enum class WeightFormat { kF32, kBF16, kF16, kMxfp4, kW4A8 };

struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t out = 0, in = 0;
  const void* data = nullptr;          // values or packed codes
  const uint8_t* scales = nullptr;     // MXFP4 (E8M0 bytes) or W4A8 (bf16 values, 2-byte aligned)
  int64_t group = 0;                   // W4A8 only: elements per scale (32, 64 or 128)
};

// Decodes row r of W into fp32 (length in).
void decode_row(const WeightMatrix& w, int64_t r, float* dst);

// y[T, out] = x[T, in] W^T.
void matmul(const WeightMatrix& w, const float* x, int64_t T, float* y);

// Scalar reference used by tests (decodes every row, plain double-free fp32 loops).
void matmul_reference(const WeightMatrix& w, const float* x, int64_t T, float* y);

}  // namespace kestrel::kernels
