// What the forms of the tiled prefill attention share (prefill_attention.cpp: the scalar definition, the AVX-512
// work item and the dispatch; prefill_attention_avx2.cpp: the AVX2 + FMA work item): the constants of the one
// exp, the sink, and the shape of a work item. Internal to those files and to gqa_decode.cpp (the same definition).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/prefill_attention.h"

namespace kestrel::kernels::prefill_tiles {

// exp(x) = 2^n · e^r, n = round(x · log2 e), r = x − n · ln 2 in two parts (Cody–Waite; n · kLn2Hi is exact),
// e^r by its degree-7 Taylor polynomial (|r| ≤ ln2/2: truncation < 5e-9 relative, under float rounding).
// Below −87 the result is 0 (there 2^n would leave the normal range; the weights are < 2e-38 of the largest).
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693145751953125f;
inline constexpr float kLn2Lo = 1.42860676533018704e-6f;
inline constexpr float kExpMin = -87.0f;
inline constexpr float kTaylor[8] = {1.0f, 1.0f, 1.0f / 2, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

inline constexpr int64_t kQueryBlock = 64;  // queries per work item (their m, l and outputs stay in L1 with a key block)
inline constexpr int64_t kQueryTile = 4;    // queries per register tile

// The key blocks of a work item (queries [t0, t0 + nq) at positions off + t0 + u) under the window: it walks
// [first_block(), last()) in steps of kKeyBlock, and block kb meets its queries [begin(kb), end(kb)): those at or
// after the block's first key whose lo is at most its last key (off + t0 + u < kb + 31 + window).
struct ItemKeys {
  int64_t off, t0, nq, window;
  int64_t first_block() const { return window_first_key(off + t0, window) / kKeyBlock * kKeyBlock; }
  int64_t last() const { return off + t0 + nq; }
  int64_t begin(int64_t kb) const { return std::max<int64_t>(0, kb - off - t0); }
  int64_t end(int64_t kb) const { return window > 0 ? std::min(nq, kb + kKeyBlock - 1 + window - off - t0) : nq; }
};

// l_u += p_u[j] for the whole block, j ascending, for the N queries of a tile: each query's sum is its own chain
// of 32 adds, the chains interleaved so their latencies overlap.
template <int N>
inline void add_weights(const float (*p)[kKeyBlock], float* l) {
  float s[N];
  for (int u = 0; u < N; ++u) s[u] = l[u];
  for (int64_t j = 0; j < kKeyBlock; ++j)
    for (int u = 0; u < N; ++u) s[u] += p[u][j];
  for (int u = 0; u < N; ++u) l[u] = s[u];
}

// The sink of the definition folded into a query's (m, l) after its last key block; scale_o(r) rescales its o.
template <typename ScaleO>
inline void add_sink(float sink, float& m, float& l, ScaleO scale_o) {
  if (sink > m) {
    const float r = prefill_exp(m - sink);
    l *= r;
    scale_o(r);
    m = sink;
  }
  l += prefill_exp(sink - m);
}

// Work item: head h (its keys and values those of head h / kv_group), queries [t0, t1) (at most kQueryBlock),
// every output row of them written; the key blocks it walks are those some query of it sees (ItemKeys).
void item_avx2(const PrefillAttentionArgs& a, int64_t h, int64_t t0, int64_t t1);

}  // namespace kestrel::kernels::prefill_tiles
