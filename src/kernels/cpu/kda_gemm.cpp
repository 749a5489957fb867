// Register-tiled small products for the KDA chunk kernel; see kda_gemm.h.
#include "kernels/cpu/kda_gemm.h"

#include <algorithm>

#include "kernels/cpu/kda_vec.h"

namespace kestrel::kernels::kda {
namespace {

// gemm_acc tile: kGemmMr rows × kGemmNv vectors of accumulators (12 registers), the B row segment in kGemmNv
// registers, A broadcast one element at a time.
constexpr int kGemmMr = 6;
constexpr int kGemmNv = 2;

template <int MR, int NV>
inline void gemm_tile(int64_t Kd, const float* A, int64_t a_rs, int64_t a_ps, const float* B, int64_t ldb, float* C,
                      int64_t ldc) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = load(C + i * ldc + v * kLanes);
  for (int64_t p = 0; p < Kd; ++p) {
    vf b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = load(B + p * ldb + v * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float x = A[i * a_rs + p * a_ps];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += x * b[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(C + i * ldc + v * kLanes, acc[i][v]);
}

template <int NV>
void gemm_tile_rows(int mr, int64_t Kd, const float* A, int64_t a_rs, int64_t a_ps, const float* B, int64_t ldb,
                    float* C, int64_t ldc) {
  switch (mr) {
    case 6: return gemm_tile<6, NV>(Kd, A, a_rs, a_ps, B, ldb, C, ldc);
    case 5: return gemm_tile<5, NV>(Kd, A, a_rs, a_ps, B, ldb, C, ldc);
    case 4: return gemm_tile<4, NV>(Kd, A, a_rs, a_ps, B, ldb, C, ldc);
    case 3: return gemm_tile<3, NV>(Kd, A, a_rs, a_ps, B, ldb, C, ldc);
    case 2: return gemm_tile<2, NV>(Kd, A, a_rs, a_ps, B, ldb, C, ldc);
    default: return gemm_tile<1, NV>(Kd, A, a_rs, a_ps, B, ldb, C, ldc);
  }
}

// gram_nt tile: kGramMr × kGramNr dot products, each a vector of partial sums over p, summed across lanes at the end.
constexpr int kGramMr = 4;
constexpr int kGramNr = kLanes >= 16 ? 4 : 2;

template <int MR, int NR>
inline void gram_tile(int64_t Kd, const float* A, int64_t lda, const float* B, int64_t ldb, float* G, int64_t ldg) {
  const int64_t kv = Kd - Kd % kLanes;
  vf acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = vf{};
  for (int64_t p = 0; p < kv; p += kLanes) {
    vf a[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) a[i] = load(A + i * lda + p);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const vf b = load(B + j * ldb + p);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] += a[i] * b;
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t p = kv; p < Kd; ++p) s += A[i * lda + p] * B[j * ldb + p];
      G[i * ldg + j] = s;
    }
  }
}

template <int MR>
void gram_tile_cols(int nr, int64_t Kd, const float* A, int64_t lda, const float* B, int64_t ldb, float* G,
                    int64_t ldg) {
  static_assert(kGramNr <= 4);
  switch (nr) {
    case 4: return gram_tile<MR, (kGramNr >= 4 ? 4 : 1)>(Kd, A, lda, B, ldb, G, ldg);
    case 3: return gram_tile<MR, (kGramNr >= 3 ? 3 : 1)>(Kd, A, lda, B, ldb, G, ldg);
    case 2: return gram_tile<MR, 2>(Kd, A, lda, B, ldb, G, ldg);
    default: return gram_tile<MR, 1>(Kd, A, lda, B, ldb, G, ldg);
  }
}

}  // namespace

void gemm_acc(int64_t M, int64_t N, int64_t Kd, const float* A, int64_t a_rs, int64_t a_ps, const float* B,
              int64_t ldb, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const int64_t nv = N / kLanes;
  // Column panels of kGemmNv vectors (their Kd×panel slice of B stays in L1 across the row tiles).
  for (int64_t v0 = 0; v0 < nv; v0 += kGemmNv) {
    const int64_t w = std::min<int64_t>(kGemmNv, nv - v0);
    const float* Bv = B + v0 * kLanes;
    for (int64_t i0 = 0; i0 < M; i0 += kGemmMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kGemmMr, M - i0));
      const float* Ai = A + i0 * a_rs;
      float* Ci = C + i0 * ldc + v0 * kLanes;
      if (w == kGemmNv) gemm_tile_rows<kGemmNv>(mr, Kd, Ai, a_rs, a_ps, Bv, ldb, Ci, ldc);
      else gemm_tile_rows<1>(mr, Kd, Ai, a_rs, a_ps, Bv, ldb, Ci, ldc);
    }
  }
  // Columns past the last whole vector.
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t n = nv * kLanes; n < N; ++n) {
      float c = C[i * ldc + n];
      for (int64_t p = 0; p < Kd; ++p) c += A[i * a_rs + p * a_ps] * B[p * ldb + n];
      C[i * ldc + n] = c;
    }
  }
}

void gram_nt(int64_t M, int64_t N, int64_t Kd, const float* A, int64_t lda, const float* B, int64_t ldb, float* G,
             int64_t ldg) {
  for (int64_t i0 = 0; i0 < M; i0 += kGramMr) {
    const int mr = static_cast<int>(std::min<int64_t>(kGramMr, M - i0));
    for (int64_t j0 = 0; j0 < N; j0 += kGramNr) {
      const int nr = static_cast<int>(std::min<int64_t>(kGramNr, N - j0));
      const float* Ai = A + i0 * lda;
      const float* Bj = B + j0 * ldb;
      float* Gij = G + i0 * ldg + j0;
      switch (mr) {
        case 4: gram_tile_cols<4>(nr, Kd, Ai, lda, Bj, ldb, Gij, ldg); break;
        case 3: gram_tile_cols<3>(nr, Kd, Ai, lda, Bj, ldb, Gij, ldg); break;
        case 2: gram_tile_cols<2>(nr, Kd, Ai, lda, Bj, ldb, Gij, ldg); break;
        default: gram_tile_cols<1>(nr, Kd, Ai, lda, Bj, ldb, Gij, ldg); break;
      }
    }
  }
}

}  // namespace kestrel::kernels::kda
