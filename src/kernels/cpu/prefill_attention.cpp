// Tiled causal attention for prefill chunks (prefill_attention.h): the scalar definition, its AVX-512 form and the
// dispatch between them and the AVX2 form (prefill_attention_avx2.cpp).
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/avx512_mask.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/exp_lanes.h"
#include "kernels/cpu/prefill_attention_tiles.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "base/check.h"
#include "kernels/cpu/parallel.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
// Holds a vector in a register: GCC otherwise folds the key loads into every FMA that uses them (8 loads of
// 64 bytes per 8 FMAs of a score tile, where 2 suffice).
#define KESTREL_IN_ZMM(x) __asm__("" : "+v"(x))

namespace kestrel::kernels {
namespace {

using namespace prefill_tiles;

void reference_one(const PrefillAttentionArgs& a, int64_t t, int64_t h) {
  const int64_t pos = a.L - a.T + t;
  const float* q = a.q + (t * a.H + h) * a.Dk;
  const int64_t hk = h / a.kv_group;  // its key/value head
  const float* kt = a.kt + hk * a.kt_head_stride;
  const float* v = a.v + hk * a.v_head_stride;
  float* o = a.out + (t * a.H + h) * a.Dv;
  std::fill(o, o + a.Dv, 0.0f);
  const int64_t lo = window_first_key(pos, a.window);
  float m = -INFINITY, l = 0.0f, s[kKeyBlock];
  for (int64_t kb = lo / kKeyBlock * kKeyBlock; kb <= pos; kb += kKeyBlock) {
    const int64_t j0 = std::max<int64_t>(0, lo - kb), n = std::min(kKeyBlock, pos - kb + 1);  // keys [j0, n)
    const float* blk = kt + kb * a.Dk;
    float mb = -INFINITY;
    for (int64_t j = j0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t d = 0; d < a.Dk; ++d) acc = std::fma(q[d], blk[d * kKeyBlock + j], acc);
      s[j] = acc * a.scale;
      mb = std::max(mb, s[j]);
    }
    if (mb > m) {
      const float r = prefill_exp(m - mb);
      l *= r;
      for (int64_t d = 0; d < a.Dv; ++d) o[d] *= r;
      m = mb;
    }
    for (int64_t j = j0; j < n; ++j) {
      const float p = prefill_exp(s[j] - m);
      l += p;
      const float* vj = v + (kb + j) * a.Dv;
      for (int64_t d = 0; d < a.Dv; ++d) o[d] = std::fma(p, vj[d], o[d]);
    }
  }
  if (a.sinks != nullptr)
    add_sink(a.sinks[h], m, l, [&](float r) {
      for (int64_t d = 0; d < a.Dv; ++d) o[d] *= r;
    });
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < a.Dv; ++d) o[d] *= inv;
}

KESTREL_AVX512 void scale_row(float* o, int64_t n, float r) {
  const __m512 rv = _mm512_set1_ps(r);
  for (int64_t w = 0; 16 * w < n; ++w) {
    const __mmask16 mk = lanes(n, w);
    _mm512_mask_storeu_ps(o + 16 * w, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + 16 * w), rv));
  }
}

constexpr int W = 4;  // value vectors per chunk: 64 lanes

// o_u[c, c + 64) = fma(p_u[j], v_j, o_u) for j0 ≤ j < n, j ascending, for the U queries of a tile that share the
// key block's values (U = 4: every query sees all 32 keys; U = 1: one query, its own keys). Full chunks load and
// store without masks (mask registers moved inside the key loop cost more than the fmas here).
template <int U, bool kMasked>
KESTREL_AVX512 inline void accumulate_chunk(float* const* o, const float (*p)[kKeyBlock], int64_t j0, int64_t n,
                                            const float* v, int64_t Dv, int64_t c) {
  __mmask16 mk[W];
  for (int w = 0; w < W; ++w) mk[w] = kMasked ? lanes(Dv - c, w) : __mmask16(0xffff);
  __m512 acc[U][W];
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < W; ++w)
      acc[u][w] = kMasked ? _mm512_maskz_loadu_ps(mk[w], o[u] + c + 16 * w) : _mm512_loadu_ps(o[u] + c + 16 * w);
  for (int64_t j = j0; j < n; ++j) {
    const float* vj = v + j * Dv + c;
    auto ld = [&](int w) { return kMasked ? _mm512_maskz_loadu_ps(mk[w], vj + 16 * w) : _mm512_loadu_ps(vj + 16 * w); };
    __m512 v0 = ld(0), v1 = ld(1), v2 = ld(2), v3 = ld(3);  // named, so that they stay in registers
    KESTREL_IN_ZMM(v0);
    KESTREL_IN_ZMM(v1);
    KESTREL_IN_ZMM(v2);
    KESTREL_IN_ZMM(v3);
    for (int u = 0; u < U; ++u) {
      const __m512 b = _mm512_set1_ps(p[u][j]);
      acc[u][0] = _mm512_fmadd_ps(b, v0, acc[u][0]);
      acc[u][1] = _mm512_fmadd_ps(b, v1, acc[u][1]);
      acc[u][2] = _mm512_fmadd_ps(b, v2, acc[u][2]);
      acc[u][3] = _mm512_fmadd_ps(b, v3, acc[u][3]);
    }
  }
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < W; ++w) {
      if (kMasked) _mm512_mask_storeu_ps(o[u] + c + 16 * w, mk[w], acc[u][w]);
      else _mm512_storeu_ps(o[u] + c + 16 * w, acc[u][w]);
    }
}

template <int U>
KESTREL_AVX512 void accumulate_values(float* const* o, const float (*p)[kKeyBlock], int64_t j0, int64_t n,
                                      const float* v, int64_t Dv) {
  int64_t c = 0;
  for (; c + 64 <= Dv; c += 64) accumulate_chunk<U, false>(o, p, j0, n, v, Dv, c);
  if (c < Dv) accumulate_chunk<U, true>(o, p, j0, n, v, Dv, c);
}

// Queries per score tile here: 8 × 32 keys is 16 accumulators, with the two key vectors held in registers
// (KESTREL_IN_ZMM) each fma has one broadcast of a query element and no load of its own.
constexpr int64_t kScoreTile = 8;

// Work item: head h (its keys and values those of head h / kv_group), queries [t0, t1) (at most kQueryBlock).
KESTREL_AVX512 void item_avx512(const PrefillAttentionArgs& a, int64_t h, int64_t t0, int64_t t1) {
  const int64_t off = a.L - a.T, nq = t1 - t0, Dk = a.Dk, Dv = a.Dv, kvh = h / a.kv_group;
  const float* kt = a.kt + kvh * a.kt_head_stride;
  const float* vh = a.v + kvh * a.v_head_stride;
  float m[kQueryBlock], l[kQueryBlock];
  alignas(64) float p[kScoreTile][kKeyBlock];
  auto out_row = [&](int64_t i) { return a.out + ((t0 + i) * a.H + h) * Dv; };
  for (int64_t i = 0; i < nq; ++i) {
    m[i] = -INFINITY, l[i] = 0.0f;
    std::fill(out_row(i), out_row(i) + Dv, 0.0f);
  }
  const __m512 scale = _mm512_set1_ps(a.scale), neg_inf = _mm512_set1_ps(-INFINITY);
  const ItemKeys keys{off, t0, nq, a.window};
  for (int64_t kb = keys.first_block(); kb < keys.last(); kb += kKeyBlock) {
    const float* blk = kt + kb * Dk;
    const int64_t end = keys.end(kb);
    for (int64_t i = keys.begin(kb); i < end; i += kScoreTile) {
      const int64_t nt = std::min(kScoreTile, end - i);
      const float* qp[kScoreTile];
      for (int64_t u = 0; u < kScoreTile; ++u) qp[u] = a.q + ((t0 + i + std::min(u, nt - 1)) * a.H + h) * Dk;
      __m512 acc[kScoreTile][2];
      for (auto& x : acc) x[0] = x[1] = _mm512_setzero_ps();
      for (int64_t d = 0; d < Dk; ++d) {
        __m512 k0 = _mm512_loadu_ps(blk + d * kKeyBlock), k1 = _mm512_loadu_ps(blk + d * kKeyBlock + 16);
        KESTREL_IN_ZMM(k0);
        KESTREL_IN_ZMM(k1);
        for (int64_t u = 0; u < kScoreTile; ++u) {
          const __m512 b = _mm512_set1_ps(qp[u][d]);
          acc[u][0] = _mm512_fmadd_ps(b, k0, acc[u][0]);
          acc[u][1] = _mm512_fmadd_ps(b, k1, acc[u][1]);
        }
      }
      int64_t j0[kScoreTile], nv[kScoreTile];  // query u sees the block's keys [j0, nv)
      for (int64_t u = 0; u < nt; ++u) {
        const int64_t pos = off + t0 + i + u;
        j0[u] = std::max<int64_t>(0, window_first_key(pos, a.window) - kb);  // < 32: the query sees the block
        nv[u] = std::min(kKeyBlock, pos - kb + 1);                           // ≥ 1: the tile starts at or after it
        const __mmask16 lo = lanes(nv[u], 0) & ~lanes(j0[u], 0), hi = lanes(nv[u], 1) & ~lanes(j0[u], 1);
        const __m512 s0 = _mm512_mask_mov_ps(neg_inf, lo, _mm512_mul_ps(acc[u][0], scale));
        const __m512 s1 = _mm512_mask_mov_ps(neg_inf, hi, _mm512_mul_ps(acc[u][1], scale));
        const float mb = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
        float& mu = m[i + u];
        if (mb > mu) {
          const float r = prefill_exp(mu - mb);
          l[i + u] *= r;
          scale_row(out_row(i + u), Dv, r);
          mu = mb;
        }
        const __m512 mv = _mm512_set1_ps(mu);
        _mm512_store_ps(p[u], exp16(_mm512_sub_ps(s0, mv)));
        _mm512_store_ps(p[u] + 16, exp16(_mm512_sub_ps(s1, mv)));
      }
      const float* vb = vh + kb * Dv;
      // Values in tiles of 4 queries (16 accumulators over 64 lanes): each group of 4 whose queries all see the
      // whole block at once (the first of them all keys up to the last, the last of them all keys from the first),
      // the rest one query at a time over its own keys.
      for (int64_t g = 0; g < nt; g += 4) {
        if (nt - g >= 4 && nv[g] == kKeyBlock && j0[g + 3] == 0) {
          add_weights<4>(p + g, l + i + g);
          float* o[4] = {out_row(i + g), out_row(i + g + 1), out_row(i + g + 2), out_row(i + g + 3)};
          accumulate_values<4>(o, p + g, 0, kKeyBlock, vb, Dv);
          continue;
        }
        for (int64_t u = g; u < std::min(nt, g + 4); ++u) {
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

void check_groups(const PrefillAttentionArgs& a) {
  KCHECK(a.kv_group >= 1 && a.H % a.kv_group == 0, "prefill_attention: kv_group must be >= 1 and divide H");
  KCHECK(a.window >= 0, "prefill_attention: window must be >= 0");
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return yes;
}

// Work items of one head × kQueryBlock queries, the latest query blocks first (they see the most keys).
template <typename Item>
void run_items(const PrefillAttentionArgs& a, Item item) {
  const int64_t blocks = (a.T + kQueryBlock - 1) / kQueryBlock;
  parallel_for_dynamic(blocks * a.H, 1, [&](int64_t i) {
    const int64_t b = blocks - 1 - i / a.H, t0 = b * kQueryBlock;
    item(a, i % a.H, t0, std::min(a.T, t0 + kQueryBlock));
  });
}

}  // namespace

float prefill_exp(float x) {
  if (!(x >= kExpMin)) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kTaylor[7];
  for (int i = 6; i >= 0; --i) p = std::fma(p, r, kTaylor[i]);
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

void prefill_attention_reference(const PrefillAttentionArgs& a) {
  check_groups(a);
  for (int64_t t = 0; t < a.T; ++t)
    for (int64_t h = 0; h < a.H; ++h) reference_one(a, t, h);
}

bool prefill_attention_avx2_supported() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

void prefill_attention_avx2(const PrefillAttentionArgs& a) {
  KCHECK(prefill_attention_avx2_supported(), "prefill_attention_avx2: this CPU lacks AVX2 or FMA");
  check_groups(a);
  if (a.T <= 0 || a.H <= 0) return;
  run_items(a, item_avx2);
}

void prefill_attention(const PrefillAttentionArgs& a) {
  check_groups(a);
  if (a.T <= 0 || a.H <= 0) return;
  if (has_avx512()) return run_items(a, item_avx512);
  if (prefill_attention_avx2_supported()) return run_items(a, item_avx2);
  parallel_for_dynamic(a.T * a.H, 4, [&](int64_t i) { reference_one(a, i / a.H, i % a.H); });
}

}  // namespace kestrel::kernels
