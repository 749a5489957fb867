// One key-tile step of the sparse MLA kernel (sparse_mla_attention.cpp) in AVX2 + FMA, for CPUs without
// AVX-512: the operations of its scalar definition (tile_step_reference) in the same order, so the same bits:
//   - a score is lane_dot's: 16 lanes (here two ymm halves, lanes 0–7 and 8–15), lane l taking the fma of
//     the elements d ≡ l (mod 16) in d order (lanes past Dk untouched), then lane_dot's sum tree, then · scale;
//     register tile of 2 heads × 2 rows (8 accumulators, the 4 row halves and a query half in registers);
//   - per head: the tile's max, the rescale of l and o when it exceeds m (scalar code, as the definition),
//     prefill_exp of each score minus the max on 8 lanes (exp8, the same bits), l summed in key order;
//   - values: o = fma(p_j, row_j, o) j ascending (o first scaled by the rescale factor where there is one),
//     in tiles of 2 heads × 32 lanes.
// Compiled with -ffp-contract=off (src/kernels/CMakeLists.txt): only the fmas written here are fused.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "kernels/cpu/avx2_lanes.h"
#include "kernels/cpu/exp_lanes.h"
#include "kernels/cpu/lane_dot.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/sparse_mla_tiles.h"

#define KESTREL_AVX2 __attribute__((target("avx2,fma")))

namespace kestrel::kernels::sparse_tiles {
namespace {

constexpr int64_t kRows = 2;  // rows per score pass

// s[u][j + r] = lane_dot(q[u], rows[r], Dk) for the U heads and the 2 rows (unscaled).
template <int U>
KESTREL_AVX2 void scores(const float* const* q, const float* const* rows, int64_t Dk, float (*s)[kSparseKeyTile + 1],
                         int64_t j) {
  __m256 acc[U][kRows][2];
  for (auto& x : acc)
    for (auto& y : x) y[0] = y[1] = _mm256_setzero_ps();
  int64_t w = 0;
  for (; 16 * w + 16 <= Dk; ++w) {
    __m256 rv[kRows][2];
    for (int r = 0; r < kRows; ++r)
      for (int h = 0; h < 2; ++h) {
        rv[r][h] = _mm256_loadu_ps(rows[r] + 16 * w + 8 * h);
        KESTREL_IN_REGISTER(rv[r][h]);
      }
    for (int u = 0; u < U; ++u)
      for (int h = 0; h < 2; ++h) {
        const __m256 qv = _mm256_loadu_ps(q[u] + 16 * w + 8 * h);
        for (int r = 0; r < kRows; ++r) acc[u][r][h] = _mm256_fmadd_ps(qv, rv[r][h], acc[u][r][h]);
      }
  }
  if (16 * w < Dk) {  // tail: lanes past Dk keep their accumulator untouched, as in lane_dot
    for (int h = 0; h < 2; ++h) {
      const __m256i mk = lanes8(Dk - 16 * w, h);
      for (int u = 0; u < U; ++u) {
        const __m256 qv = _mm256_maskload_ps(q[u] + 16 * w + 8 * h, mk);
        for (int r = 0; r < kRows; ++r) {
          const __m256 f = _mm256_fmadd_ps(qv, _mm256_maskload_ps(rows[r] + 16 * w + 8 * h, mk), acc[u][r][h]);
          acc[u][r][h] = _mm256_blendv_ps(acc[u][r][h], f, _mm256_castsi256_ps(mk));
        }
      }
    }
  }
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < kRows; ++r) s[u][j + r] = lane_sum_avx2(acc[u][r][0], acc[u][r][1]);
}

// o_u[c, c + 8W) = rescaled o_u, then fma(p_u[j], row_j, ·) for j < n ascending.
template <int U, int W>
KESTREL_AVX2 inline void values_chunk(float* const* o, const float (*p)[kSparseKeyTile + 1], const float* r,
                                      const bool* rescale, const float* const* rows, int64_t n, int64_t c) {
  __m256 acc[U][W];
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < W; ++w) {
      acc[u][w] = _mm256_loadu_ps(o[u] + c + 8 * w);
      if (rescale[u]) acc[u][w] = _mm256_mul_ps(acc[u][w], _mm256_set1_ps(r[u]));
    }
  for (int64_t j = 0; j < n; ++j) {
    __m256 v[W];
    for (int w = 0; w < W; ++w) {
      v[w] = _mm256_loadu_ps(rows[j] + c + 8 * w);
      KESTREL_IN_REGISTER(v[w]);
    }
    for (int u = 0; u < U; ++u) {
      const __m256 b = _mm256_broadcast_ss(p[u] + j);
      for (int w = 0; w < W; ++w) acc[u][w] = _mm256_fmadd_ps(b, v[w], acc[u][w]);
    }
  }
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(o[u] + c + 8 * w, acc[u][w]);
}

// The last Dv − c (< 8) lanes, masked.
template <int U>
KESTREL_AVX2 inline void values_tail(float* const* o, const float (*p)[kSparseKeyTile + 1], const float* r,
                                     const bool* rescale, const float* const* rows, int64_t n, int64_t c, int64_t Dv) {
  const __m256i mk = lanes8(Dv - c, 0);
  __m256 acc[U];
  for (int u = 0; u < U; ++u) {
    acc[u] = _mm256_maskload_ps(o[u] + c, mk);
    if (rescale[u]) acc[u] = _mm256_mul_ps(acc[u], _mm256_set1_ps(r[u]));
  }
  for (int64_t j = 0; j < n; ++j) {
    const __m256 v = _mm256_maskload_ps(rows[j] + c, mk);
    for (int u = 0; u < U; ++u) acc[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(p[u] + j), v, acc[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_maskstore_ps(o[u] + c, mk, acc[u]);
}

template <int U>
KESTREL_AVX2 void step(const float* const* q, const float* const* rows, int64_t n, const SparseMlaArgs& a, float* m,
                       float* l, float* const* o) {
  alignas(32) float s[U][kSparseKeyTile + 1];
  for (int64_t j = 0; j < n; j += kRows) {
    const float* rr[kRows] = {rows[j], rows[std::min(j + 1, n - 1)]};  // a row past n repeats the last one
    scores<U>(q, rr, a.Dk, s, j);
  }
  float r[U];
  bool rescale[U];
  for (int u = 0; u < U; ++u) {
    float mb = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      s[u][j] *= a.scale;
      mb = std::max(mb, s[u][j]);
    }
    r[u] = 1.0f;
    rescale[u] = mb > m[u];
    if (rescale[u]) {
      r[u] = prefill_exp(m[u] - mb);
      l[u] *= r[u];
      m[u] = mb;
    }
    const __m256 mv = _mm256_set1_ps(m[u]);
    for (int64_t h = 0; 8 * h < n; ++h)  // exp on 8 lanes (lanes past n read as 0 and are never used)
      _mm256_storeu_ps(s[u] + 8 * h, exp8(_mm256_sub_ps(_mm256_maskload_ps(s[u] + 8 * h, lanes8(n, h)), mv)));
    for (int64_t j = 0; j < n; ++j) l[u] += s[u][j];  // the sum in key order, as the definition
  }
  int64_t c = 0;
  for (; c + 32 <= a.Dv; c += 32) values_chunk<U, 4>(o, s, r, rescale, rows, n, c);
  for (; c + 8 <= a.Dv; c += 8) values_chunk<U, 1>(o, s, r, rescale, rows, n, c);
  if (c < a.Dv) values_tail<U>(o, s, r, rescale, rows, n, c, a.Dv);
}

}  // namespace

void tile_step_avx2(int heads, const float* const* q, const float* const* rows, int64_t n, const SparseMlaArgs& a,
                    float* m, float* l, float* const* o) {
  KCHECK(heads == 1 || heads == 2, "sparse_mla tile_step_avx2: 1 or 2 heads per step");
  if (heads == 2) return step<2>(q, rows, n, a, m, l, o);
  step<1>(q, rows, n, a, m, l, o);
}

}  // namespace kestrel::kernels::sparse_tiles
