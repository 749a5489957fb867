#include "kernels/cpu/gqa_decode.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/exp_lanes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/prefill_attention_tiles.h"
#include "kernels/cpu/scratch.h"

namespace kestrel::kernels {
namespace {

constexpr int kLanes = 8;  // query heads per score vector

void check(const GqaDecodeArgs& a) {
  KCHECK(a.T >= 1 && a.T <= a.L && a.H >= 1 && a.G >= 1 && a.H % a.G == 0 && a.D >= 1,
         "gqa_decode: needs 1 <= T <= L, G dividing H, D >= 1");
  KCHECK(a.window >= 0, "gqa_decode: window must be >= 0");
  KCHECK(a.row.lora == 2 * a.G * a.D && a.row.rope == 0, "gqa_decode: rows must be [k | v] of G heads of width D");
}

const uint8_t* row_at(const GqaDecodeArgs& a, int64_t j) {
  return a.pages[j / a.page_tokens] + (j % a.page_tokens) * a.row.bytes();
}

// KV head g's keys and values of positions [kb, kb + n) as fp32: kp[j] / vp[j] point into the row (fp32 pages)
// or at its slice decoded into k / v ([n][D]; other page dtypes: only this head's slices are decoded).
void block_slices(const GqaDecodeArgs& a, int64_t kb, int64_t n, int64_t g, float* k, float* v, const float** kp,
                  const float** vp) {
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* r = row_at(a, kb + j);
    if (a.row.dtype == KvCacheDtype::kF32) {
      kp[j] = reinterpret_cast<const float*>(r) + g * a.D;
      vp[j] = reinterpret_cast<const float*>(r) + (a.G + g) * a.D;
      continue;
    }
    kv_load_range(a.row, r, g * a.D, a.D, k + j * a.D);
    kv_load_range(a.row, r, (a.G + g) * a.D, a.D, v + j * a.D);
    kp[j] = k + j * a.D, vp[j] = v + j * a.D;
  }
}

#define KESTREL_AVX2_FMA __attribute__((target("avx2,fma")))

// Lanes where mb > m: r = exp(m − mb), l ·= r, o ·= r (each head's row of o, [kLanes][D]), m = mb.
KESTREL_AVX2_FMA inline void raise_max(__m256 mb, int nh, int64_t D, __m256& m, __m256& l, float* o) {
  const __m256 grow = _mm256_cmp_ps(mb, m, _CMP_GT_OQ);
  const int gm = _mm256_movemask_ps(grow);
  if (gm == 0) return;
  const __m256 r = exp8(_mm256_sub_ps(m, mb));
  l = _mm256_blendv_ps(l, _mm256_mul_ps(l, r), grow);
  m = _mm256_blendv_ps(m, mb, grow);
  alignas(32) float rs[kLanes];
  _mm256_store_ps(rs, r);
  for (int i = 0; i < nh; ++i) {
    if (!(gm >> i & 1)) continue;
    const __m256 rv = _mm256_set1_ps(rs[i]);
    float* oi = o + i * D;
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(oi + d, _mm256_mul_ps(_mm256_loadu_ps(oi + d), rv));
    for (; d < D; ++d) oi[d] *= rs[i];
  }
}

// The sink of heads [h0, h0 + nh) (sinks[i] for lane i), after the last block: the rescale when it exceeds m, then
// l += exp(sink − m). Unused lanes take a sink of −∞ (no rescale, weight 0).
KESTREL_AVX2_FMA inline void add_sinks(const float* sinks, int nh, int64_t D, __m256& m, __m256& l, float* o) {
  alignas(32) float sk[kLanes];
  for (int i = 0; i < kLanes; ++i) sk[i] = i < nh ? sinks[i] : -INFINITY;
  const __m256 sv = _mm256_load_ps(sk);
  raise_max(sv, nh, D, m, l, o);
  l = _mm256_add_ps(l, exp8(_mm256_sub_ps(sv, m)));
}

// Query t of sequence a, key/value head g: its H / G query heads, kLanes at a time.
KESTREL_AVX2_FMA void item_avx2(const GqaDecodeArgs& a, int64_t t, int64_t g) {
  const int64_t D = a.D, per = a.H / a.G, pos = a.L - a.T + t, lo = window_first_key(pos, a.window);
  float* kv = thread_scratch(kScratchGqaRows, static_cast<size_t>(2 * kKeyBlock * D));
  float* const kbuf = kv;
  float* const vbuf = kv + kKeyBlock * D;
  float* qt = thread_scratch(kScratchGqaQ, static_cast<size_t>(D * kLanes));
  float* o = thread_scratch(kScratchGqaOut, static_cast<size_t>(kLanes * D));
  const float *kp[kKeyBlock], *vp[kKeyBlock];
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t h0 = g * per; h0 < (g + 1) * per; h0 += kLanes) {
    const int nh = static_cast<int>(std::min<int64_t>(kLanes, (g + 1) * per - h0));
    // q transposed: qt[d · 8 + i] = q[t, h0 + i, d] (zeros in unused lanes).
    for (int64_t d = 0; d < D; ++d)
      for (int i = 0; i < kLanes; ++i) qt[d * kLanes + i] = i < nh ? a.q[(t * a.H + h0 + i) * D + d] : 0.0f;
    std::fill(o, o + kLanes * D, 0.0f);
    __m256 m = _mm256_set1_ps(-INFINITY), l = _mm256_setzero_ps();
    alignas(32) float s[kKeyBlock][kLanes];
    for (int64_t kb = lo / kKeyBlock * kKeyBlock; kb <= pos; kb += kKeyBlock) {
      // The block's keys the query sees, [first, first + n): index j below is key first + j.
      const int64_t first = std::max(kb, lo), n = std::min(kKeyBlock, pos - kb + 1) - (first - kb);
      block_slices(a, first, n, g, kbuf, vbuf, kp, vp);
      // Scores, 8 keys at a time (independent chains over d, each lane the definition's own fma chain).
      __m256 mb = _mm256_set1_ps(-INFINITY);
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const float* k[8];
        for (int u = 0; u < 8; ++u) k[u] = kp[j + u];
        __m256 c[8];
        for (int u = 0; u < 8; ++u) c[u] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; ++d) {
          const __m256 qd = _mm256_loadu_ps(qt + d * kLanes);
          for (int u = 0; u < 8; ++u) c[u] = _mm256_fmadd_ps(qd, _mm256_broadcast_ss(k[u] + d), c[u]);
        }
        for (int u = 0; u < 8; ++u) {
          const __m256 sv = _mm256_mul_ps(c[u], scale);
          _mm256_store_ps(s[j + u], sv);
          mb = _mm256_max_ps(sv, mb);  // std::max(mb, s): mb unless s is larger (NaN keeps mb)
        }
      }
      for (; j < n; ++j) {
        const float* k = kp[j];
        __m256 c = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; ++d) c = _mm256_fmadd_ps(_mm256_loadu_ps(qt + d * kLanes), _mm256_broadcast_ss(k + d), c);
        const __m256 sv = _mm256_mul_ps(c, scale);
        _mm256_store_ps(s[j], sv);
        mb = _mm256_max_ps(sv, mb);
      }
      raise_max(mb, nh, D, m, l, o);
      // Weights (l summed over keys ascending), then each head's values: its output slice stays in registers
      // while the block's keys go by in order (every element's fma chain over j ascending, as the definition).
      alignas(32) float ps[kKeyBlock][kLanes];
      for (j = 0; j < n; ++j) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(s[j]), m));
        l = _mm256_add_ps(l, p);
        _mm256_store_ps(ps[j], p);
      }
      for (int i = 0; i < nh; ++i) {
        float* oi = o + i * D;
        int64_t d0 = 0;
        for (; d0 + 64 <= D; d0 += 64) {
          __m256 acc[8];
          for (int u = 0; u < 8; ++u) acc[u] = _mm256_loadu_ps(oi + d0 + 8 * u);
          for (j = 0; j < n; ++j) {
            const __m256 pv = _mm256_set1_ps(ps[j][i]);
            const float* v = vp[j] + d0;
            for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8 * u), acc[u]);
          }
          for (int u = 0; u < 8; ++u) _mm256_storeu_ps(oi + d0 + 8 * u, acc[u]);
        }
        for (; d0 + 8 <= D; d0 += 8) {
          __m256 acc = _mm256_loadu_ps(oi + d0);
          for (j = 0; j < n; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(ps[j][i]), _mm256_loadu_ps(vp[j] + d0), acc);
          _mm256_storeu_ps(oi + d0, acc);
        }
        for (; d0 < D; ++d0) {
          float acc = oi[d0];
          for (j = 0; j < n; ++j) acc = std::fma(ps[j][i], vp[j][d0], acc);
          oi[d0] = acc;
        }
      }
    }
    if (a.sinks != nullptr) add_sinks(a.sinks + h0, nh, D, m, l, o);
    alignas(32) float ls[kLanes];
    _mm256_store_ps(ls, l);
    for (int i = 0; i < nh; ++i) {
      const float inv = 1.0f / ls[i];
      float* dst = a.out + (t * a.H + h0 + i) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = o[i * D + d] * inv;
    }
  }
}

void one_reference(const GqaDecodeArgs& a, int64_t t, int64_t h, std::vector<float>& kv) {
  const int64_t D = a.D, g = h / (a.H / a.G), pos = a.L - a.T + t;
  const float* q = a.q + (t * a.H + h) * D;
  float* o = a.out + (t * a.H + h) * D;
  std::fill(o, o + D, 0.0f);
  kv.resize(static_cast<size_t>(2 * kKeyBlock * D));
  float *kbuf = kv.data(), *vbuf = kv.data() + kKeyBlock * D;
  const float *kp[kKeyBlock], *vp[kKeyBlock];
  const int64_t lo = window_first_key(pos, a.window);
  float m = -INFINITY, l = 0.0f, s[kKeyBlock];
  for (int64_t kb = lo / kKeyBlock * kKeyBlock; kb <= pos; kb += kKeyBlock) {
    // The block's keys the query sees, [first, first + n): index j below is key first + j.
    const int64_t first = std::max(kb, lo), n = std::min(kKeyBlock, pos - kb + 1) - (first - kb);
    block_slices(a, first, n, g, kbuf, vbuf, kp, vp);
    float mb = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* k = kp[j];
      float acc = 0.0f;
      for (int64_t d = 0; d < D; ++d) acc = std::fma(q[d], k[d], acc);
      s[j] = acc * a.scale;
      mb = std::max(mb, s[j]);
    }
    if (mb > m) {
      const float r = prefill_exp(m - mb);
      l *= r;
      for (int64_t d = 0; d < D; ++d) o[d] *= r;
      m = mb;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float p = prefill_exp(s[j] - m);
      l += p;
      const float* v = vp[j];
      for (int64_t d = 0; d < D; ++d) o[d] = std::fma(p, v[d], o[d]);
    }
  }
  if (a.sinks != nullptr)
    prefill_tiles::add_sink(a.sinks[h], m, l, [&](float r) {
      for (int64_t d = 0; d < D; ++d) o[d] *= r;
    });
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < D; ++d) o[d] *= inv;
}

bool avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace

void gqa_decode_reference(const GqaDecodeArgs& a) {
  check(a);
  std::vector<float> row;
  for (int64_t t = 0; t < a.T; ++t)
    for (int64_t h = 0; h < a.H; ++h) one_reference(a, t, h, row);
}

void gqa_decode(std::span<const GqaDecodeArgs> seqs) {
  int64_t items = 0;
  for (const GqaDecodeArgs& a : seqs) check(a), items += a.T * a.G;
  const bool vec = avx2_fma();
  parallel_for_dynamic(items, 1, [&](int64_t i) {
    size_t s = 0;
    while (i >= seqs[s].T * seqs[s].G) i -= seqs[s].T * seqs[s].G, ++s;
    const GqaDecodeArgs& a = seqs[s];
    const int64_t t = i / a.G, g = i % a.G;
    if (vec) {
      item_avx2(a, t, g);
    } else {
      thread_local std::vector<float> row;
      for (int64_t h = g * (a.H / a.G); h < (g + 1) * (a.H / a.G); ++h) one_reference(a, t, h, row);
    }
  });
}

}  // namespace kestrel::kernels
