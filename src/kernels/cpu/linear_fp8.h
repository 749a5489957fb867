// DeepSeek FP8 block weights (docs/model-math.md §8): W [out, in] as float8_e4m3fn bytes and
// `weight_scale_inv` fp32 [ceil(out/128), ceil(in/128)]; W(i, j) = e4m3(i, j) · scale_inv[i/128, j/128].
// Edge blocks are partial (the checkpoint's scales were computed over the zero-padded block).
// Activations stay fp32 (no 1×128 activation quantisation): the matmul runs on the exact
// dequantised weights. Pure functions.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace kestrel::kernels {

inline constexpr int64_t kFp8Block = 128;

// Row r of an FP8 block matrix as fp32 (length w.in).
void decode_fp8_block_row(const WeightMatrix& w, int64_t r, float* dst);

// Number of scale blocks along each dimension.
inline int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

}  // namespace kestrel::kernels
