// Latent attention (MLA's absorbed form) in key tiles, for sparse MLA (dsa_indexer.h: sparse_mla_attention,
// each query's selected rows) and for dense causal MLA (attention.h: causal_attention): span_state attends one
// span of a query's list (sparse_mla_tiles.h) kSparseKeyTile rows at a time (decoded once per tile for the whole
// group of heads when the cache is not fp32): every head scores the tile four rows per pass over its query
// (lane_dot.h), takes one online-softmax step for the tile (one rescale, one exp per key) and accumulates the
// tile's values into its output once per tile. The scalar definition below, the AVX-512 form and the AVX2 + FMA
// form (sparse_mla_attention_avx2.cpp) compute the same bits; a head's result does not depend on the head
// grouping, the thread count or the other queries. On AVX-512 the next tile's rows are prefetched while a tile
// is scored, one cache line of each of four rows per 16-lane step, the lines spread over the tile's score passes
// (one per group of four heads) so the requests trickle out over the whole tile (the hardware prefetchers left
// decode at depth waiting on the rows; all of them in the first pass left it waiting less, but still waiting).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/avx512_mask.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/exp_lanes.h"
#include "kernels/cpu/kv_row.h"
#include "kernels/cpu/lane_dot.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/sparse_mla_tiles.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
#define KESTREL_IN_ZMM(x) __asm__("" : "+v"(x))

namespace kestrel::kernels {
namespace {

// One tile step of one head: scores s (scaled), running max m and sum l, output o over Dv.
void tile_step_reference(const float* q, const float* const* rows, int64_t n, const SparseMlaArgs& a, float& m,
                         float& l, float* o) {
  float s[kSparseKeyTile];
  float mb = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = lane_dot(q, rows[j], a.Dk) * a.scale;
    mb = std::max(mb, s[j]);
  }
  if (mb > m) {
    const float r = prefill_exp(m - mb);
    l *= r;
    for (int64_t d = 0; d < a.Dv; ++d) o[d] *= r;
    m = mb;
  }
  for (int64_t j = 0; j < n; ++j) {
    s[j] = prefill_exp(s[j] - m);
    l += s[j];
  }
  for (int64_t d = 0; d < a.Dv; ++d)
    for (int64_t j = 0; j < n; ++j) o[d] = std::fma(s[j], rows[j][d], o[d]);
}

// The 16 lane sums of a 4 × 4 block of accumulators in one transposing pass, each in lane_sum's tree (lanes
// (l, l + 8), then (l, l + 4), then (0, 2) and (1, 3), then the two): lane 4u + r of the result is
// lane_sum_avx512(acc[u][r]), bit for bit (a sum of two floats does not depend on their order).
KESTREL_AVX512 inline __m512 lane_sums_4x4(const __m512 (&acc)[4][4]) {
  __m512 a[16], b[8], c[4], d[2];
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < 4; ++u) a[4 * r + u] = acc[u][r];
  for (int i = 0; i < 8; ++i)  // (l, l + 8): the two accumulators' lanes 0-7 beside their lanes 8-15
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // (l, l + 4): 128-bit blocks 0, 2 beside 1, 3
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // (0, 2) and (1, 3) within each block
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44), _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));  // then the two
}

// Scores of U heads against rows[0, 4) of the tile (rows past n repeat the last one): U × 4 accumulators,
// each (head, row) accumulating as lane_dot, every q and row load shared; line w of each pf[r] is prefetched
// at step w for w < pf_lines, w = pf_phase, pf_phase + pf_stride, …
template <int U>
KESTREL_AVX512 void scores_avx512(const float* const* q, const float* const* rows, int64_t Dk, float (*s)[kSparseKeyTile + 3],
                                  int64_t j, const uint8_t* const* pf, int64_t pf_lines, int64_t pf_phase,
                                  int64_t pf_stride) {
  int64_t due = pf_phase;
  __m512 acc[U][4];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < 4; ++r) acc[u][r] = _mm512_setzero_ps();
  int64_t w = 0;
  for (; 16 * w + 16 <= Dk; ++w) {
    // Each row and query vector loaded once into a register (GCC would otherwise fold the loads of one of
    // them into every fma that uses it: 20 loads per 16 fmas instead of 8).
    __m512 r0 = _mm512_loadu_ps(rows[0] + 16 * w), r1 = _mm512_loadu_ps(rows[1] + 16 * w);
    __m512 r2 = _mm512_loadu_ps(rows[2] + 16 * w), r3 = _mm512_loadu_ps(rows[3] + 16 * w);
    KESTREL_IN_ZMM(r0);
    KESTREL_IN_ZMM(r1);
    KESTREL_IN_ZMM(r2);
    KESTREL_IN_ZMM(r3);
    if (w == due && w < pf_lines) {
      for (int r = 0; r < 4; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf[r] + 64 * w), _MM_HINT_T0);
      due += pf_stride;
    }
    for (int u = 0; u < U; ++u) {
      __m512 qv = _mm512_loadu_ps(q[u] + 16 * w);
      KESTREL_IN_ZMM(qv);
      acc[u][0] = _mm512_fmadd_ps(qv, r0, acc[u][0]);
      acc[u][1] = _mm512_fmadd_ps(qv, r1, acc[u][1]);
      acc[u][2] = _mm512_fmadd_ps(qv, r2, acc[u][2]);
      acc[u][3] = _mm512_fmadd_ps(qv, r3, acc[u][3]);
    }
  }
  if (16 * w < Dk) {  // tail: lanes past Dk keep their accumulator untouched, as in lane_dot
    const __mmask16 mk = lanes(Dk, w);
    __m512 rv[4];
    for (int r = 0; r < 4; ++r) rv[r] = _mm512_maskz_loadu_ps(mk, rows[r] + 16 * w);
    for (int u = 0; u < U; ++u) {
      const __m512 qv = _mm512_maskz_loadu_ps(mk, q[u] + 16 * w);
      for (int r = 0; r < 4; ++r) acc[u][r] = _mm512_mask3_fmadd_ps(qv, rv[r], acc[u][r], mk);
    }
  }
  if constexpr (U == 4) {
    const __m512 sums = lane_sums_4x4(acc);
    _mm_storeu_ps(s[0] + j, _mm512_extractf32x4_ps(sums, 0));
    _mm_storeu_ps(s[1] + j, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(s[2] + j, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(s[3] + j, _mm512_extractf32x4_ps(sums, 3));
  } else {
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < 4; ++r) s[u][j + r] = lane_sum_avx512(acc[u][r]);
  }
}

// One tile step of U heads at once (the steps of tile_step_reference, per head, sharing every row load).
template <int U>
KESTREL_AVX512 void tile_step_avx512(const float* const* q, const float* const* rows, int64_t n, const SparseMlaArgs& a,
                                     float* m, float* l, float* const* o, const uint8_t* const* next, int64_t next_n,
                                     int64_t pf_lines, int64_t pf_phase, int64_t pf_stride) {
  alignas(64) float s[U][kSparseKeyTile + 3];
  for (int64_t j = 0; j < n; j += 4) {
    const float* rr[4];
    const uint8_t* pf[4];
    for (int64_t r = 0; r < 4; ++r) rr[r] = rows[std::min(j + r, n - 1)];
    for (int64_t r = 0; r < 4; ++r) pf[r] = next_n > 0 ? next[std::min(j + r, next_n - 1)] : nullptr;
    scores_avx512<U>(q, rr, a.Dk, s, j, pf, next_n > 0 ? pf_lines : 0, pf_phase, pf_stride);
  }
  __m512 rv[U];
  bool rescale[U];
  const __mmask16 live = lanes(n, 0);
  for (int u = 0; u < U; ++u) {  // the tile's scores are one vector: scale, max and exp on 16 lanes
    const __m512 sv = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, s[u]), _mm512_set1_ps(a.scale));
    const float mb = _mm512_mask_reduce_max_ps(live, sv);
    float r = 1.0f;
    rescale[u] = mb > m[u];
    if (rescale[u]) {
      r = prefill_exp(m[u] - mb);
      l[u] *= r;
      m[u] = mb;
    }
    _mm512_storeu_ps(s[u], exp16(_mm512_sub_ps(sv, _mm512_set1_ps(m[u]))));
    for (int64_t j = 0; j < n; ++j) l[u] += s[u][j];  // the sum in key order, as the definition
    rv[u] = _mm512_set1_ps(r);
  }
  constexpr int W = U == 1 ? 4 : 2;  // 16-lane chunks of the output per pass: U · W accumulators
  for (int64_t c = 0; c < a.Dv; c += 16 * W) {
    __mmask16 mk[W];
    __m512 acc[U][W];
    for (int w = 0; w < W; ++w) mk[w] = lanes(a.Dv - c, w);
    for (int u = 0; u < U; ++u)
      for (int w = 0; w < W; ++w) {
        acc[u][w] = _mm512_maskz_loadu_ps(mk[w], o[u] + c + 16 * w);
        if (rescale[u]) acc[u][w] = _mm512_mul_ps(acc[u][w], rv[u]);
      }
    for (int64_t j = 0; j < n; ++j) {
      __m512 v[W];
      for (int w = 0; w < W; ++w) v[w] = _mm512_maskz_loadu_ps(mk[w], rows[j] + c + 16 * w);
      for (int u = 0; u < U; ++u) {
        const __m512 p = _mm512_set1_ps(s[u][j]);
        for (int w = 0; w < W; ++w) acc[u][w] = _mm512_fmadd_ps(p, v[w], acc[u][w]);
      }
    }
    for (int u = 0; u < U; ++u)
      for (int w = 0; w < W; ++w) _mm512_mask_storeu_ps(o[u] + c + 16 * w, mk[w], acc[u][w]);
  }
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return yes;
}

using sparse_tiles::Path;

void run(const SparseMlaArgs& a, Path path) {
  if (a.H <= 0 || a.T <= 0) return;
  std::vector<sparse_tiles::LatentQuery>& qs = sparse_tiles::query_scratch(static_cast<size_t>(a.T));
  for (int64_t t = 0; t < a.T; ++t) qs[t] = {&a, t, a.idx + t * a.topk, a.topk};
  sparse_tiles::attend(std::span<const sparse_tiles::LatentQuery>(qs.data(), static_cast<size_t>(a.T)), path);
}

}  // namespace

namespace sparse_tiles {

Path best_path() {
  return has_avx512() ? Path::kAvx512 : sparse_mla_attention_avx2_supported() ? Path::kAvx2 : Path::kScalar;
}

void span_state(const SparseMlaArgs& a, int64_t t, int64_t h0, int64_t nh, const int32_t* idx, int64_t begin,
                int64_t end, int64_t prefetch_end, Path path, float* m, float* l, float* const* out) {
  KCHECK(nh >= 1 && nh <= kMaxHeadGroup, "latent attention: 1 to 16 heads per span state");
  const int64_t row_bytes = a.row.bytes(), row_n = std::max(a.Dk, a.Dv);
  float* buf = a.row.dtype != KvCacheDtype::kF32
                   ? thread_scratch(kScratchKvRow, static_cast<size_t>(kSparseKeyTile * row_n))
                   : nullptr;
  for (int64_t g = 0; g < nh; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f;
    std::fill(out[g], out[g] + a.Dv, 0.0f);
  }
  auto row_at = [&](int64_t j) { return a.pages[j / a.page_tokens] + (j % a.page_tokens) * row_bytes; };
  const float* rows[kSparseKeyTile];
  const uint8_t* next[kSparseKeyTile];
  const int64_t pf_lines = (row_bytes + 63) / 64;
  for (int64_t i = begin; i < end;) {
    int64_t n = 0;
    for (; i < end && n < kSparseKeyTile; ++i) {
      const int64_t j = idx ? idx[i] : i;
      if (j < 0) continue;
      rows[n] = kv_row_floats(a.row, row_at(j), row_n, buf ? buf + n * row_n : nullptr);
      ++n;
    }
    if (n == 0) break;
    // The next tile's rows (up to prefetch_end), prefetched during this tile's first score pass (AVX-512).
    int64_t next_n = 0;
    if (path == Path::kAvx512)
      for (int64_t k = i; k < prefetch_end && next_n < kSparseKeyTile; ++k) {
        const int64_t j = idx ? idx[k] : k;
        if (j >= 0) next[next_n++] = row_at(j);
      }
    int64_t g = 0;
    const float* q[4];
    float* o[4];
    auto at = [&](int64_t k) {
      q[k - g] = a.q + (t * a.H + h0 + k) * a.Dk;
      o[k - g] = out[k];
    };
    if (path == Path::kAvx512)
      for (; g + 4 <= nh; g += 4) {  // four heads per pass over the tile's rows
        for (int64_t k = g; k < g + 4; ++k) at(k);
        tile_step_avx512<4>(q, rows, n, a, m + g, l + g, o, next, next_n, pf_lines, g / 4, nh / 4);
      }
    if (path == Path::kAvx2)
      for (; g + 2 <= nh; g += 2) {  // two heads per pass
        at(g), at(g + 1);
        tile_step_avx2(2, q, rows, n, a, m + g, l + g, o);
      }
    for (; g < nh; ++g) {
      at(g);
      if (path == Path::kAvx512) tile_step_avx512<1>(q, rows, n, a, m + g, l + g, o, next, g == 0 ? next_n : 0, pf_lines, 0, 1);
      else if (path == Path::kAvx2) tile_step_avx2(1, q, rows, n, a, m + g, l + g, o);
      else tile_step_reference(q[0], rows, n, a, m[g], l[g], o[0]);
    }
  }
}

}  // namespace sparse_tiles

bool sparse_mla_attention_avx2_supported() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

void sparse_mla_attention(const SparseMlaArgs& a) { run(a, sparse_tiles::best_path()); }

void sparse_mla_attention_avx2(const SparseMlaArgs& a) {
  KCHECK(sparse_mla_attention_avx2_supported(), "sparse_mla_attention_avx2: this CPU lacks AVX2 or FMA");
  run(a, Path::kAvx2);
}

void sparse_mla_attention_reference(const SparseMlaArgs& a) { run(a, Path::kScalar); }

}  // namespace kestrel::kernels
