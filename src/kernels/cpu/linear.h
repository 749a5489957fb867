// Linear layers y = x W^T with weights kept in their checkpoint format (no fp32 copy).
//   W: [out, in] row-major, dtype F32 / BF16 / F16, or MXFP4 (compressed-tensors packing:
//      packed U8 [out, in/2], byte j = code(2j) | code(2j+1) << 4; scales E8M0 U8 [out, in/32]).
//      GGUF block formats (kGgufQ8_0 / kGgufQ4_0 / kGgufMxfp4): `data` is the row-major ggml block
//      stream, in/32 blocks per row, used in place (see linear_gguf.h); `scales` unused.
//   x: [T, in] fp32, y: [T, out] fp32. Accumulation fp32.
// Thread-safety: pure functions; parallel over output rows with OpenMP.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace kestrel::kernels {

enum class WeightFormat { kF32, kBF16, kF16, kMxfp4, kGgufQ8_0, kGgufQ4_0, kGgufMxfp4 };

struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t out = 0, in = 0;
  const void* data = nullptr;          // values or packed codes
  const uint8_t* scales = nullptr;     // MXFP4 only
};

// Decodes row r of W into fp32 (length in).
void decode_row(const WeightMatrix& w, int64_t r, float* dst);

// y[T, out] = x[T, in] W^T.
void matmul(const WeightMatrix& w, const float* x, int64_t T, float* y);

// Scalar reference used by tests (decodes every row, plain double-free fp32 loops).
void matmul_reference(const WeightMatrix& w, const float* x, int64_t T, float* y);

}  // namespace kestrel::kernels
