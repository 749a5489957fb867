// The work item of the tiled prefill attention (prefill_attention.h) in AVX2 + FMA, for CPUs without AVX-512.
// Its arithmetic is the definition's, operation for operation, so it gives the scalar definition's bits:
//   - scores: per (query, key) one fma chain over d from 0, in a register tile of 4 queries × 16 keys (two per
//     key block of 32: 8 accumulators, 2 key vectors and a broadcast in the 16 ymm registers), then · scale;
//   - per query and key block: the block's max (lanes past the query's position or below its window at −∞), the
//     rescale of l and o when it exceeds m, exp(s − m) on 8 lanes with the definition's polynomial, l summed over
//     the query's keys j ascending;
//   - values: o = fma(p_j, v_j, o) j ascending over the query's keys, in tiles of 4 queries × 16 value lanes
//     (8 accumulators);
//   - the sink, then out = o · (1 / l).
// Compiled with -ffp-contract=off (src/kernels/CMakeLists.txt): only the fmas written here are fused.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx2_lanes.h"
#include "kernels/cpu/exp_lanes.h"
#include "kernels/cpu/prefill_attention_tiles.h"

#define KESTREL_AVX2 __attribute__((target("avx2,fma")))

namespace kestrel::kernels::prefill_tiles {
namespace {

constexpr int64_t kHalf = 16;  // keys per score tile


KESTREL_AVX2 void scale_row(float* o, int64_t n, float r) {
  const __m256 rv = _mm256_set1_ps(r);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), rv));
  for (; d < n; ++d) o[d] *= r;
}

// s[u][k0 + x] = (fma chain over d of q_u[d] · key k0 + x) · scale for x < 16, the 4 queries qp[u].
KESTREL_AVX2 void score_half(const float* const* qp, const float* blk, int64_t k0, int64_t Dk, __m256 scale,
                             float (*s)[kKeyBlock]) {
  __m256 acc[kQueryTile][2];
  for (auto& x : acc) x[0] = x[1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < Dk; ++d) {
    const float* kd = blk + d * kKeyBlock + k0;
    __m256 ka = _mm256_loadu_ps(kd), kb = _mm256_loadu_ps(kd + 8);
    KESTREL_IN_REGISTER(ka);
    KESTREL_IN_REGISTER(kb);
    for (int64_t u = 0; u < kQueryTile; ++u) {
      const __m256 b = _mm256_broadcast_ss(qp[u] + d);
      acc[u][0] = _mm256_fmadd_ps(b, ka, acc[u][0]);
      acc[u][1] = _mm256_fmadd_ps(b, kb, acc[u][1]);
    }
  }
  for (int64_t u = 0; u < kQueryTile; ++u) {
    _mm256_store_ps(s[u] + k0, _mm256_mul_ps(acc[u][0], scale));
    _mm256_store_ps(s[u] + k0 + 8, _mm256_mul_ps(acc[u][1], scale));
  }
}

// o_u[c, c + 8W) = fma(p_u[j], v_j, o_u) for j0 ≤ j < n, j ascending, the U queries' rows o[u] (all lanes present).
template <int U, int W>
KESTREL_AVX2 inline void accumulate_chunk(float* const* o, const float (*p)[kKeyBlock], int64_t j0, int64_t n,
                                          const float* v, int64_t Dv, int64_t c) {
  __m256 acc[U][W];
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < W; ++w) acc[u][w] = _mm256_loadu_ps(o[u] + c + 8 * w);
  for (int64_t j = j0; j < n; ++j) {
    const float* vj = v + j * Dv + c;
    __m256 vv[W];
    for (int w = 0; w < W; ++w) {
      vv[w] = _mm256_loadu_ps(vj + 8 * w);
      KESTREL_IN_REGISTER(vv[w]);
    }
    for (int u = 0; u < U; ++u) {
      const __m256 b = _mm256_broadcast_ss(p[u] + j);
      for (int w = 0; w < W; ++w) acc[u][w] = _mm256_fmadd_ps(b, vv[w], acc[u][w]);
    }
  }
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(o[u] + c + 8 * w, acc[u][w]);
}

// The last Dv − c (< 8) lanes, masked.
template <int U>
KESTREL_AVX2 inline void accumulate_tail(float* const* o, const float (*p)[kKeyBlock], int64_t j0, int64_t n,
                                         const float* v, int64_t Dv, int64_t c) {
  const __m256i mk = lanes8(Dv - c, 0);
  __m256 acc[U];
  for (int u = 0; u < U; ++u) acc[u] = _mm256_maskload_ps(o[u] + c, mk);
  for (int64_t j = j0; j < n; ++j) {
    const __m256 vv = _mm256_maskload_ps(v + j * Dv + c, mk);
    for (int u = 0; u < U; ++u) acc[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(p[u] + j), vv, acc[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_maskstore_ps(o[u] + c, mk, acc[u]);
}

// Every value lane of the U rows: 16 lanes at a time, then 8, then the masked rest.
template <int U>
KESTREL_AVX2 void accumulate_values(float* const* o, const float (*p)[kKeyBlock], int64_t j0, int64_t n,
                                    const float* v, int64_t Dv) {
  int64_t c = 0;
  for (; c + 16 <= Dv; c += 16) accumulate_chunk<U, 2>(o, p, j0, n, v, Dv, c);
  if (c + 8 <= Dv) accumulate_chunk<U, 1>(o, p, j0, n, v, Dv, c), c += 8;
  if (c < Dv) accumulate_tail<U>(o, p, j0, n, v, Dv, c);
}

}  // namespace

KESTREL_AVX2 void item_avx2(const PrefillAttentionArgs& a, int64_t h, int64_t t0, int64_t t1) {
  const int64_t off = a.L - a.T, nq = t1 - t0, Dk = a.Dk, Dv = a.Dv, kvh = h / a.kv_group;
  const float* kt = a.kt + kvh * a.kt_head_stride;
  const float* vh = a.v + kvh * a.v_head_stride;
  float m[kQueryBlock], l[kQueryBlock];
  alignas(32) float p[kQueryTile][kKeyBlock];  // scores, then their weights
  auto out_row = [&](int64_t i) { return a.out + ((t0 + i) * a.H + h) * Dv; };
  for (int64_t i = 0; i < nq; ++i) {
    m[i] = -INFINITY, l[i] = 0.0f;
    std::fill(out_row(i), out_row(i) + Dv, 0.0f);
  }
  const __m256 scale = _mm256_set1_ps(a.scale), neg_inf = _mm256_set1_ps(-INFINITY);
  const ItemKeys keys{off, t0, nq, a.window};
  for (int64_t kb = keys.first_block(); kb < keys.last(); kb += kKeyBlock) {
    const float* blk = kt + kb * Dk;
    const int64_t end = keys.end(kb);
    for (int64_t i = keys.begin(kb); i < end; i += kQueryTile) {
      const int64_t nt = std::min(kQueryTile, end - i);
      const float* qp[kQueryTile];
      for (int64_t u = 0; u < kQueryTile; ++u) qp[u] = a.q + ((t0 + i + std::min(u, nt - 1)) * a.H + h) * Dk;
      score_half(qp, blk, 0, Dk, scale, p);
      score_half(qp, blk, kHalf, Dk, scale, p);
      int64_t j0[kQueryTile], nv[kQueryTile];  // query u sees the block's keys [j0, nv)
      for (int64_t u = 0; u < nt; ++u) {
        const int64_t pos = off + t0 + i + u;
        j0[u] = std::max<int64_t>(0, window_first_key(pos, a.window) - kb);  // < 32: the query sees the block
        nv[u] = std::min(kKeyBlock, pos - kb + 1);                           // ≥ 1: the tile starts at or after it
        __m256 s[4], mx = neg_inf;
        for (int w = 0; w < 4; ++w) {
          const __m256i seen = _mm256_andnot_si256(lanes8(j0[u], w), lanes8(nv[u], w));
          s[w] = _mm256_blendv_ps(neg_inf, _mm256_load_ps(p[u] + 8 * w), _mm256_castsi256_ps(seen));
          mx = _mm256_max_ps(mx, s[w]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float mb = _mm_cvtss_f32(m4);
        float& mu = m[i + u];
        if (mb > mu) {
          const float r = prefill_exp(mu - mb);
          l[i + u] *= r;
          scale_row(out_row(i + u), Dv, r);
          mu = mb;
        }
        const __m256 mv = _mm256_set1_ps(mu);
        for (int w = 0; w < 4; ++w) _mm256_store_ps(p[u] + 8 * w, exp8(_mm256_sub_ps(s[w], mv)));
      }
      const float* vb = vh + kb * Dv;
      // Every query of the tile sees the whole block: the first all keys up to the last, the last all from the first.
      if (nt == kQueryTile && nv[0] == kKeyBlock && j0[kQueryTile - 1] == 0) {
        add_weights<kQueryTile>(p, l + i);
        float* o[kQueryTile] = {out_row(i), out_row(i + 1), out_row(i + 2), out_row(i + 3)};
        accumulate_values<kQueryTile>(o, p, 0, kKeyBlock, vb, Dv);
      } else {
        for (int64_t u = 0; u < nt; ++u) {
          for (int64_t j = j0[u]; j < nv[u]; ++j) l[i + u] += p[u][j];
          float* o[1] = {out_row(i + u)};
          accumulate_values<1>(o, p + u, j0[u], nv[u], vb, Dv);
        }
      }
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    if (a.sinks != nullptr) add_sink(a.sinks[h], m[i], l[i], [&](float r) { scale_row(out_row(i), Dv, r); });
    scale_row(out_row(i), Dv, 1.0f / l[i]);
  }
}

}  // namespace kestrel::kernels::prefill_tiles
