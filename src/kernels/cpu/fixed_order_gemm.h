// fp32 GEMM in which every output element is one chain of fused multiply-adds over k = 0, 1, …, K−1, starting
// from 0: y[t][n] = fma(x[t][K−1], B[n][K−1], … fma(x[t][0], B[n][0], 0.0f) …). An element's bits are a function
// of its row of x and its row of B alone: not of T, of the other rows, of where a caller cuts the rows or columns
// among threads, or of the CPU's vector width (the AVX2 kernel and the portable loop give the same bits).
// matmul_sgemm (blas_gemm.h) runs on it where OpenBLAS's core does not keep a row's bits independent of the product
// (its AVX2 cores). Register-blocked: 6 rows × 16 columns per micro-tile, K in blocks of 256 (the partial sums go
// through y between blocks, exactly as the chain would carry them), rows in blocks of 96 that stay in L2.
#pragma once

#include <cstdint>

namespace kestrel::kernels {

// B [N, K] is packed in panels of kFixedGemmPanel columns: panel p holds rows [16p, 16p + 16) of B as [K][16],
// zeros past N.
inline constexpr int64_t kFixedGemmPanel = 16;

inline int64_t fixed_gemm_packed_floats(int64_t N, int64_t K) {
  return (N + kFixedGemmPanel - 1) / kFixedGemmPanel * kFixedGemmPanel * K;
}

// Writes row n of B (K floats) into its panel of `packed` (fixed_gemm_packed_floats(N, K) floats); rows past N of
// the last panel must be packed as zeros (fixed_gemm_pack_zero_rows).
void fixed_gemm_pack_row(const float* row, int64_t n, int64_t K, float* packed);
void fixed_gemm_pack_zero_rows(int64_t N, int64_t K, float* packed);

// y[T, N] (leading dimension ldy) = x[T, K] (leading dimension ldx) · Bᵀ, B packed as above; on the calling thread.
void fixed_order_gemm(int64_t T, int64_t N, int64_t K, const float* x, int64_t ldx, const float* packed, float* y,
                      int64_t ldy);

}  // namespace kestrel::kernels
