// fp32 GEMM over OpenBLAS for the vision tower and projector (blas_gemm.h): cblas_sgemm, the output columns split
// among the OpenMP threads, the zero-row padding that keeps every product on OpenBLAS's blocked kernels, and the
// slice-by-slice decode of non-fp32 weights (packed for the fixed-order GEMM on OpenBLAS's AVX2 cores).
#include "kernels/cpu/blas_gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fixed_order_gemm.h"
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

// The epilogue, elementwise over n contiguous floats of y.
void apply_epilogue(float* y, int64_t n, GemmEpilogue epilogue) {
  if (epilogue == GemmEpilogue::kGeluTanh) gelu_tanh_inplace(y, n);
  if (epilogue == GemmEpilogue::kGeluErf)
    for (float* v = y; v < y + n; ++v) *v = 0.5f * *v * (1.0f + std::erf(*v * static_cast<float>(M_SQRT1_2)));
}

// Output columns [c0, c1) for all T rows, on the calling thread: slices of at most kDecodeSliceFloats weight floats,
// equal widths in multiples of kGemmColumnAlign, one single-threaded product each (a non-fp32 weight decoded slice by
// slice into this thread's buffer), then the epilogue on the slice.
void run_columns(const WeightMatrix& w, const float* x, int64_t T, float* y, GemmEpilogue epilogue, int64_t c0,
                 int64_t c1) {
  const int64_t K = w.in, cols = c1 - c0;
  if (cols <= 0) return;
  const int64_t max_cols =
      std::max<int64_t>(kGemmColumnAlign, kDecodeSliceFloats / K / kGemmColumnAlign * kGemmColumnAlign);
  const int64_t slices = (cols + max_cols - 1) / max_cols;
  const int64_t width = (cols / slices + kGemmColumnAlign - 1) / kGemmColumnAlign * kGemmColumnAlign;
  const bool fixed_order = !sgemm_rows_invariant();
  for (int64_t n0 = c0; n0 < c1; n0 += width) {
    const int64_t nn = std::min(width, c1 - n0);
    if (fixed_order) {  // Kestrel's fixed-order product: its rows of B packed in panels (decoded row by row)
      float* packed = thread_scratch(kScratchBlasWeights, static_cast<size_t>(fixed_gemm_packed_floats(nn, K)));
      float* row = thread_scratch(kScratchBlasPadX, static_cast<size_t>(K));
      for (int64_t r = 0; r < nn; ++r) {
        if (w.format == WeightFormat::kF32) {
          fixed_gemm_pack_row(static_cast<const float*>(w.data) + (n0 + r) * K, r, K, packed);
        } else {
          decode_row(w, n0 + r, row);
          fixed_gemm_pack_row(row, r, K, packed);
        }
      }
      fixed_gemm_pack_zero_rows(nn, K, packed);
      fixed_order_gemm(T, nn, K, x, K, packed, y + n0, w.out);
      if (epilogue != GemmEpilogue::kNone)
        for (int64_t t = 0; t < T; ++t) apply_epilogue(y + t * w.out + n0, nn, epilogue);
      continue;
    }
    const float* B = static_cast<const float*>(w.data) + n0 * K;
    if (w.format != WeightFormat::kF32) {
      float* buf = thread_scratch(kScratchBlasWeights, static_cast<size_t>(nn * K));
      for (int64_t r = 0; r < nn; ++r) decode_row(w, n0 + r, buf + r * K);
      B = buf;
    }
    padded_gemm(T, nn, K, x, B, y + n0, w.out);
    if (epilogue != GemmEpilogue::kNone)
      for (int64_t t = 0; t < T; ++t) apply_epilogue(y + t * w.out + n0, nn, epilogue);
  }
}

}  // namespace

bool sgemm_rows_invariant() {
  static const bool yes = [] {
    const std::string core = openblas_get_corename();
    return core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
  }();
  return yes;
}

void matmul_sgemm(const WeightMatrix& w, const float* x, int64_t T, float* y, GemmEpilogue epilogue) {
  if (T <= 0) return;
  if (omp_get_max_threads() == 1) {
    run_columns(w, x, T, y, epilogue, 0, w.out);
    return;
  }
  // Thread i takes the i-th of n equal column ranges (edges on kGemmColumnAlign), or, when that would give a thread
  // fewer than kGemmMinColumns columns, the i-th of n equal row ranges with every column. Even a single range goes
  // through the region: inside it OpenBLAS runs single-threaded, as for every other range.
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
    if (w.out < kGemmMinColumns * n) {
      const int64_t r0 = T * i / n, r1 = T * (i + 1) / n;
      if (r1 > r0) run_columns(w, x + r0 * w.in, r1 - r0, y + r0 * w.out, epilogue, 0, w.out);
    } else {
      const auto edge = [&](int64_t k) {
        return std::min(w.out, (w.out * k / n + kGemmColumnAlign / 2) / kGemmColumnAlign * kGemmColumnAlign);
      };
      run_columns(w, x, T, y, epilogue, i == 0 ? 0 : edge(i), i == n - 1 ? w.out : edge(i + 1));
    }
  }
}

}  // namespace kestrel::kernels
