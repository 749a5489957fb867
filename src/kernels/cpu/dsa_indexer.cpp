#include "kernels/cpu/dsa_indexer.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {

void hadamard_rotate(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void rope_neox(float* x, int64_t rope, int64_t pos, const float* inv_freq, float mag) {
  const int64_t half = rope / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float ang = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(ang) * mag, s = std::sin(ang) * mag;
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = a * s + b * c;
  }
}

namespace {

struct Cand {
  float s;
  int32_t pos;
};
// a ranks before b: higher score, then lower position.
inline bool better(const Cand& a, const Cand& b) { return a.s > b.s || (a.s == b.s && a.pos < b.pos); }

inline const uint8_t* key_row(const IndexerTopkArgs& a, int64_t j) {
  return a.pages[j / a.page_tokens] + (j % a.page_tokens) * indexer_row_bytes(a.D);
}
inline float key_scale(const IndexerTopkArgs& a, const uint8_t* row) {
  float s;
  std::memcpy(&s, row + a.D, 4);
  return s;
}

// Four dot products q·k0..k3 (keys consecutive, stride D; D a multiple of 16): four independent
// accumulator chains, one horizontal sum each.
// GCC 12 reports a false -Wmaybe-uninitialized inside its own AVX-512 intrinsic headers here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
inline void dot4(const float* q, const float* k0, int64_t D, float* out) {
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < D; i += 16) {
    const __m512 qv = _mm512_loadu_ps(q + i);
    a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + i), a0);
    a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + D + i), a1);
    a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 2 * D + i), a2);
    a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 3 * D + i), a3);
  }
  // Fold 512 → 256 (high half added onto the low half), then one 4-way horizontal reduction.
  auto fold = [](__m512 v) { return _mm512_castps512_ps256(_mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xEE))); };
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(fold(a0), fold(a1)), _mm256_hadd_ps(fold(a2), fold(a3)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int r = 0; r < 4; ++r) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + r * D + i), a[r]);
  }
  for (int r = 0; r < 4; ++r) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a[r]), _mm256_extractf128_ps(a[r], 1));
    const __m128 s2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    out[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
#else
  for (int r = 0; r < 4; ++r) {
    float acc = 0.0f;
    for (int64_t i = 0; i < D; ++i) acc += q[i] * k0[r * D + i];
    out[r] = acc;
  }
#endif
}

// 4 queries (q + r·qs) × 4 consecutive keys (stride D): out[r][c] = q_r · k_c. Every key vector load
// feeds four FMAs and every query load four: half the loads of four dot4 calls.
inline void dot4x4(const float* q, int64_t qs, const float* k, int64_t D, float out[4][4]) {
#if defined(__AVX512F__)
  __m512 acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < D; i += 16) {
    __m512 kv[4];
    for (int c = 0; c < 4; ++c) kv[c] = _mm512_loadu_ps(k + c * D + i);
    for (int r = 0; r < 4; ++r) {
      const __m512 qv = _mm512_loadu_ps(q + r * qs + i);
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
    }
  }
  auto fold = [](__m512 v) { return _mm512_castps512_ps256(_mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xEE))); };
  for (int r = 0; r < 4; ++r) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(fold(acc[r][0]), fold(acc[r][1])),
                                    _mm256_hadd_ps(fold(acc[r][2]), fold(acc[r][3])));
    _mm_storeu_ps(out[r], _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
#else
  for (int r = 0; r < 4; ++r) dot4(q + r * qs, k, D, out[r]);
#endif
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

constexpr int64_t kKeyTile = 128;   // keys decoded to fp32 at once (64 KiB for D = 128)
constexpr int64_t kQueryBlock = 8;  // queries sharing one decoded key tile

}  // namespace

void indexer_scores_reference(const IndexerTopkArgs& a, int64_t t, int64_t n, float* scores) {
  const float* lut = e4m3_table();
  std::vector<float> q(static_cast<size_t>(a.H * a.D)), k(static_cast<size_t>(a.D));
  for (int64_t i = 0; i < a.H * a.D; ++i) q[static_cast<size_t>(i)] = lut[a.q[t * a.H * a.D + i]];
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* r = key_row(a, j);
    for (int64_t i = 0; i < a.D; ++i) k[static_cast<size_t>(i)] = lut[r[i]];
    double acc = 0;
    for (int64_t h = 0; h < a.H; ++h) {
      double d = 0;
      for (int64_t i = 0; i < a.D; ++i) d += static_cast<double>(q[static_cast<size_t>(h * a.D + i)]) * k[static_cast<size_t>(i)];
      acc += static_cast<double>(a.w[t * a.H + h]) * std::max(d, 0.0);
    }
    scores[j] = static_cast<float>(acc * key_scale(a, r));
  }
}

void indexer_topk(const IndexerTopkArgs& a) {
  const int64_t T = a.T, H = a.H, D = a.D, K = a.topk, off = a.L - a.T;
  KCHECK(D % 16 == 0, "indexer head dim must be a multiple of 16");
  // Rows that see ≤ topk keys select all of them (the reference's top-k then only adds masked
  // slots, which its causal mask removes again) — no scoring needed.
  int64_t first_scored = std::clamp<int64_t>(K - off, 0, T);  // query t is scored iff off + t + 1 > K
  for (int64_t t = 0; t < first_scored; ++t) {
    int32_t* o = a.out + t * K;
    const int64_t n = off + t + 1;
    for (int64_t j = 0; j < K; ++j) o[j] = j < n ? static_cast<int32_t>(j) : -1;
  }
  const int64_t Ts = T - first_scored;
  if (Ts == 0) return;

  // Decoded queries [T, H, D] (raw e4m3 values; the scale is folded into w).
  thread_local std::vector<float> qf;
  thread_local std::vector<Cand> heaps;
  thread_local std::vector<int32_t> heap_n;
  qf.resize(static_cast<size_t>(T * H * D));
  decode_e4m3(a.q, qf.data(), T * H * D);

  // Work split: blocks of queries × ranges of keys. Few queries (decode) → split the keys so every
  // thread has work; each split keeps its own heaps, merged below.
  const int threads = omp_get_max_threads();
  const int64_t qblocks = (Ts + kQueryBlock - 1) / kQueryBlock;
  const int64_t L_needed = a.L;
  int64_t splits = 1;
  if (qblocks < threads) splits = std::clamp<int64_t>(L_needed / (4 * kKeyTile), 1, 4 * threads);
  const int64_t split_len = ((L_needed + splits - 1) / splits + kKeyTile - 1) / kKeyTile * kKeyTile;
  // Sized by T (not Ts) so a chunk whose first rows took the shortcut does not regrow it later.
  if (heaps.size() < static_cast<size_t>(splits * T * K)) heaps.resize(static_cast<size_t>(splits * T * K));
  heap_n.assign(static_cast<size_t>(splits * Ts), 0);
  // The thread_local buffers above belong to the calling thread: workers use these pointers.
  const float* qfp = qf.data();
  Cand* heapp = heaps.data();
  int32_t* hnp = heap_n.data();

  // Tiles (split, query block) dynamically scheduled, split-major as a collapse(2) loop would be.
  parallel_for_dynamic(splits * qblocks, 1, [&](int64_t tile) {
    const int64_t sp = tile / qblocks, qb = tile % qblocks;
    thread_local std::vector<float> kf, ks, sc;
    kf.resize(static_cast<size_t>(kKeyTile * D));
    ks.resize(static_cast<size_t>(kKeyTile));
    sc.resize(static_cast<size_t>(4 * kKeyTile));
    const int64_t t0 = first_scored + qb * kQueryBlock, t1 = std::min(T, t0 + kQueryBlock);
    const int64_t k_begin = sp * split_len;
    const int64_t k_end = std::min(off + t1, (sp + 1) * split_len);  // last query sees keys < off + t1
    for (int64_t j0 = k_begin; j0 < k_end; j0 += kKeyTile) {
      const int64_t nk = std::min(kKeyTile, k_end - j0);
      const int64_t nk4 = (nk + 3) / 4 * 4;  // padded to whole dot4 groups (pad rows are zero)
      for (int64_t j = 0; j < nk; ++j) {
        const uint8_t* r = key_row(a, j0 + j);
        decode_e4m3(r, kf.data() + j * D, D);
        ks[static_cast<size_t>(j)] = key_scale(a, r);
      }
      std::fill(kf.begin() + nk * D, kf.begin() + nk4 * D, 0.0f);
      // Scores of the block's queries against the tile, 4 queries × 4 keys at a time.
      for (int64_t tq = t0; tq < t1; tq += 4) {
        const int64_t nq = std::min<int64_t>(4, t1 - tq);
        const int64_t upto = std::min(nk, off + tq + nq - j0);  // keys the last of these queries sees
        if (upto <= 0) continue;
        const int64_t nj = (upto + 3) / 4 * 4;
        std::fill(sc.begin(), sc.begin() + 4 * kKeyTile, 0.0f);
        for (int64_t h = 0; h < H; ++h)
          for (int64_t j = 0; j < nj; j += 4) {
            float d[4][4];
            if (nq == 4) dot4x4(qfp + (tq * H + h) * D, H * D, kf.data() + j * D, D, d);
            else
              for (int64_t r = 0; r < nq; ++r) dot4(qfp + ((tq + r) * H + h) * D, kf.data() + j * D, D, d[r]);
            for (int64_t r = 0; r < nq; ++r) {
              const float wh = a.w[(tq + r) * H + h];
              for (int c = 0; c < 4; ++c)
                if (d[r][c] > 0.0f) sc[static_cast<size_t>(r * kKeyTile + j + c)] += wh * d[r][c];
            }
          }
        for (int64_t r = 0; r < nq; ++r) {
          const int64_t t = tq + r;
          const int64_t visible = std::min(nk, off + t + 1 - j0);  // causal: keys ≤ off + t
          Cand* heap = heapp + (sp * Ts + (t - first_scored)) * K;
          int32_t& hn = hnp[sp * Ts + (t - first_scored)];
          const float* srow = sc.data() + r * kKeyTile;
          for (int64_t j = 0; j < visible; ++j) {
            const Cand c{srow[j] * ks[static_cast<size_t>(j)], static_cast<int32_t>(j0 + j)};
            if (hn < K) {
              heap[hn++] = c;
              std::push_heap(heap, heap + hn, better);  // top = the worst kept candidate
            } else if (better(c, heap[0])) {
              std::pop_heap(heap, heap + K, better);
              heap[K - 1] = c;
              std::push_heap(heap, heap + K, better);
            }
          }
        }
      }
    }
  });

  // Merge the splits per query; positions ascending.
  parallel_for(0, Ts, 1, true, [&](int64_t ti) {
    thread_local std::vector<Cand> all;
    all.clear();
    for (int64_t sp = 0; sp < splits; ++sp) {
      const Cand* heap = heapp + (sp * Ts + ti) * K;
      all.insert(all.end(), heap, heap + hnp[sp * Ts + ti]);
    }
    const int64_t keep = std::min<int64_t>(K, static_cast<int64_t>(all.size()));
    if (static_cast<int64_t>(all.size()) > keep) std::nth_element(all.begin(), all.begin() + keep - 1, all.end(), better);
    int32_t* o = a.out + (first_scored + ti) * K;
    for (int64_t j = 0; j < keep; ++j) o[j] = all[static_cast<size_t>(j)].pos;
    std::sort(o, o + keep);
    for (int64_t j = keep; j < K; ++j) o[j] = -1;
  });
}

}  // namespace kestrel::kernels
