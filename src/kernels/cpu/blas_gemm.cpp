// fp32 GEMM over OpenBLAS for the vision tower and projector (blas_gemm.h): cblas_sgemm, the fixed tiles shared
// among the OpenMP threads, the zero-row padding that keeps every tile on OpenBLAS's blocked kernels, and the
// chunk-by-chunk decode of non-fp32 weights.
#include "kernels/cpu/blas_gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/elementwise.h"
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

// Tiles [u0, u1) of a product with `row_blocks` row blocks per column chunk (tile u: chunk u / row_blocks, row
// block u % row_blocks), on the calling thread; a chunk of a non-fp32 weight is decoded when the run reaches it.
void run_tiles(const WeightMatrix& w, const float* x, int64_t T, float* y, GemmEpilogue epilogue, int64_t row_blocks,
               int64_t u0, int64_t u1) {
  const int64_t K = w.in;
  int64_t decoded = -1;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t chunk = u / row_blocks, n0 = chunk * kGemmColumnChunk, nn = std::min(kGemmColumnChunk, w.out - n0);
    const int64_t m0 = u % row_blocks * kGemmRowBlock, mm = std::min(kGemmRowBlock, T - m0);
    const float* B = static_cast<const float*>(w.data) + n0 * K;
    if (w.format != WeightFormat::kF32) {
      float* buf = thread_scratch(kScratchBlasWeights, static_cast<size_t>(kGemmColumnChunk * K));
      if (decoded != chunk)
        for (int64_t r = 0; r < nn; ++r) decode_row(w, n0 + r, buf + r * K);
      decoded = chunk;
      B = buf;
    }
    float* tile = y + m0 * w.out + n0;
    padded_gemm(mm, nn, K, x + m0 * K, B, tile, w.out);
    if (epilogue == GemmEpilogue::kGeluTanh)
      for (int64_t r = 0; r < mm; ++r) gelu_tanh_inplace(tile + r * w.out, nn);
  }
}

}  // namespace

void matmul_sgemm(const WeightMatrix& w, const float* x, int64_t T, float* y, GemmEpilogue epilogue) {
  if (T <= 0) return;
  const int64_t row_blocks = (T + kGemmRowBlock - 1) / kGemmRowBlock;
  const int64_t tiles = row_blocks * ((w.out + kGemmColumnChunk - 1) / kGemmColumnChunk);
  if (omp_get_max_threads() == 1) {
    run_tiles(w, x, T, y, epilogue, row_blocks, 0, tiles);
    return;
  }
  // Even with one tile the call goes through the region: inside it OpenBLAS runs single-threaded, as for every
  // other tile (its threaded driver would block K differently).
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
    run_tiles(w, x, T, y, epilogue, row_blocks, tiles * i / n, tiles * (i + 1) / n);
  }
}

}  // namespace kestrel::kernels
