// fp32 GEMM through OpenBLAS (Debian's OpenMP build, libopenblas-openmp-dev): the dense products of the vision
// tower and projector (docs/vision.md §5.4 says why a library and not a kernel of our own).
// Threads: OpenBLAS's OpenMP build uses omp_get_max_threads() threads, and one thread inside a parallel region,
// so it follows the engine's thread count.
// Arithmetic (OpenBLAS 0.3.21, checked by `VisionTowerTest.ImageAloneEqualsItsRowsInTheBatch` and
// `BlasGemm.*`): a C element is a dot product over K whose blocking depends on K and on whether the threaded
// driver runs; M and N are only cut into tiles and thread shares. Products with M·N·K ≤ 10^6 go through separate
// small-matrix kernels that sum in another order, so `matmul_sgemm` pads M with zero rows up to
// kMinGemmWork / (N·K): with a fixed thread count a row of y then never depends on M or on the other rows.
// Across thread counts the bits may differ (K between one and two of OpenBLAS's K blocks is cut differently by
// its threaded and single-threaded drivers).
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace kestrel::kernels {

// C[M, N] = alpha · A[M, K] · op(B), op(B) = B^T with B [N, K] (trans_b) or B [K, N]; row-major, leading
// dimensions lda / ldb / ldc; C is overwritten (beta 0). No padding: for products whose shapes never change
// with the batch (one image's attention).
void sgemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float* C, int64_t ldc);

// y[T, w.out] = x[T, w.in] W^T in fp32, a row of y independent of T and of the other rows (see above). A weight not
// stored as fp32 (bf16, f16, …) is decoded a slice of rows at a time (at most kDecodeSliceFloats floats, per-thread
// buffer) and multiplied slice by slice; slicing N leaves every element's arithmetic unchanged.
void matmul_sgemm(const WeightMatrix& w, const float* x, int64_t T, float* y);

inline constexpr int64_t kDecodeSliceFloats = int64_t{1} << 21;  // 8 MiB of decoded weight rows
inline constexpr int64_t kMinGemmWork = int64_t{1} << 21;        // M·N·K of every padded product (> 10^6)

}  // namespace kestrel::kernels
