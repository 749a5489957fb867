// fp32 GEMM through OpenBLAS (Debian's OpenMP build, libopenblas-openmp-dev): the dense products of the vision
// tower and projector (docs/vision.md §5.4 says why a library and not a kernel of our own).
// Threads: matmul_sgemm gives each OpenMP thread an equal range of output columns (weight rows) and multiplies it,
// all T rows at once (a narrow product: an equal range of rows, all columns), by single-threaded OpenBLAS calls
// (OpenBLAS's OpenMP build runs one thread inside a parallel region); faster than OpenBLAS's own threaded driver on
// the tower (docs/PERFORMANCE.md "Vision encoder").
// Arithmetic (OpenBLAS 0.3.21, checked by `BlasGemm.*` and `VisionTowerTest.ImageAloneEqualsItsRowsInTheBatch`):
// a C element is a dot product over K whose blocking depends on K alone in the single-threaded driver; M and N are
// only cut into tiles. Products with M·N·K ≤ 10^6 go through separate small-matrix kernels that sum in another
// order, so every product is padded with zero rows up to kMinGemmWork / (N·K). A row of y therefore never depends
// on T, on the other rows, or on the thread count (every product runs single-threaded; where the row or column
// ranges are cut changes no element's arithmetic).
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace kestrel::kernels {

// C[M, N] = alpha · A[M, K] · op(B), op(B) = B^T with B [N, K] (trans_b) or B [K, N]; row-major, leading
// dimensions lda / ldb / ldc; C is overwritten (beta 0). No padding, OpenBLAS's own threading.
void sgemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float* C, int64_t ldc);

// What matmul_sgemm applies elementwise to each thread's output slice right after its product.
enum class GemmEpilogue { kNone, kGeluTanh, kGeluErf };  // kGeluErf: nn.GELU(), 0.5·x·(1 + erf(x/√2))

// y[T, w.out] = x[T, w.in] W^T in fp32 (then the epilogue elementwise), a row of y independent of T, of the other
// rows and of the thread count (see above). A weight not stored as fp32 (bf16, f16, …) is decoded a slice of rows
// at a time (at most kDecodeSliceFloats floats, per-thread buffer) and multiplied slice by slice.
// On an OpenBLAS core other than its AVX-512 ones (SkylakeX, Cooperlake, SapphireRapids) the row invariance above does
// not hold (its AVX2 cores, Zen and Haswell, give a row other bits at another place in the product; docs/vision.md
// §5.4), so there each slice runs on Kestrel's fixed-order GEMM instead (fixed_order_gemm.h: every element one FMA
// chain over K, register-blocked), with the same column split among threads: the same guarantee, not the same bits
// as OpenBLAS.
void matmul_sgemm(const WeightMatrix& w, const float* x, int64_t T, float* y,
                  GemmEpilogue epilogue = GemmEpilogue::kNone);
// Whether OpenBLAS's core keeps a row's bits independent of the product (the path matmul_sgemm takes).
bool sgemm_rows_invariant();

inline constexpr int64_t kDecodeSliceFloats = int64_t{1} << 21;  // 8 MiB of decoded weight rows per thread
inline constexpr int64_t kGemmColumnAlign = 64;                  // column ranges and slices start on multiples
inline constexpr int64_t kGemmMinColumns = 512;                  // fewer per thread: split the rows instead
inline constexpr int64_t kMinGemmWork = int64_t{1} << 21;        // M·N·K of every padded product (> 10^6)

}  // namespace kestrel::kernels
