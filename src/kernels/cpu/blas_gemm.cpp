// fp32 GEMM over OpenBLAS for the vision tower and projector (blas_gemm.h): cblas_sgemm, the zero-row padding that
// keeps every product on OpenBLAS's blocked kernels, and the slice-by-slice decode of non-fp32 weights.
#include "kernels/cpu/blas_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

namespace kestrel::kernels {

void sgemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), 0.0f, C, static_cast<blasint>(ldc));
}

namespace {

// y[T, N] (leading dimension ldy) = x[T, K] B^T with B [N, K]; T padded with zero rows to kMinGemmWork / (N·K).
void padded_gemm(int64_t T, int64_t N, int64_t K, const float* x, const float* B, float* y, int64_t ldy) {
  const int64_t need = (kMinGemmWork + N * K - 1) / (N * K);
  if (T >= need) {
    sgemm(true, T, N, K, 1.0f, x, K, B, K, y, ldy);
    return;
  }
  float* xp = thread_scratch(kScratchBlasPadX, static_cast<size_t>(need * K));
  float* yp = thread_scratch(kScratchBlasPadY, static_cast<size_t>(need * N));
  std::memcpy(xp, x, static_cast<size_t>(T * K) * sizeof(float));
  std::fill(xp + T * K, xp + need * K, 0.0f);
  sgemm(true, need, N, K, 1.0f, xp, K, B, K, yp, N);
  for (int64_t t = 0; t < T; ++t) std::memcpy(y + t * ldy, yp + t * N, static_cast<size_t>(N) * sizeof(float));
}

}  // namespace

void matmul_sgemm(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  if (T <= 0) return;
  if (w.format == WeightFormat::kF32) {
    padded_gemm(T, w.out, w.in, x, static_cast<const float*>(w.data), y, w.out);
    return;
  }
  const int64_t slice = std::max<int64_t>(1, kDecodeSliceFloats / w.in);
  float* buf = thread_scratch(kScratchBlasWeights, static_cast<size_t>(std::min(slice, w.out) * w.in));
  for (int64_t r0 = 0; r0 < w.out; r0 += slice) {
    const int64_t rows = std::min(slice, w.out - r0);
    parallel_for(0, rows, 1, rows * w.in >= (1 << 16), [&](int64_t r) { decode_row(w, r0 + r, buf + r * w.in); });
    padded_gemm(T, rows, w.in, x, buf, y + r0, w.out);
  }
}

}  // namespace kestrel::kernels
