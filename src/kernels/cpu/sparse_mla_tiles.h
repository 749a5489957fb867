// The key-tile kernel of latent attention (MLA's absorbed, MQA form over cached latent rows), shared by
// sparse MLA (dsa_indexer.h: sparse_mla_attention, the rows each query selected) and dense causal MLA
// (attention.h: causal_attention, every row up to the query's position):
//   - a query's list of rows is cut into spans at fixed list positions (span_rows: a function of the list's
//     length alone); each span is attended from a fresh online-softmax state (sparse_mla_attention.cpp:
//     span_state, kSparseKeyTile rows per tile, the AVX2 + FMA tile step in sparse_mla_attention_avx2.cpp);
//   - the spans' states are merged in list order, then normalised (latent_spans.cpp: merge_span, attend).
// So a head's bits depend on its query and rows only: not on the other queries, the head grouping, the thread
// count, or whether one thread took the whole list or the spans were spread over threads. Internal to those
// files and attention.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/dsa_indexer.h"

namespace kestrel::kernels::sparse_tiles {

inline constexpr int64_t kMaxHeadGroup = 16;  // heads of one query in one span_state call
inline constexpr int64_t kSpanRows = 512;     // list entries per span, at least
inline constexpr int64_t kMaxSpans = 16;      // longer lists take longer spans (a multiple of the key tile)

// List entries per span for a list of `count` entries, and the number of spans.
inline int64_t span_rows(int64_t count) {
  const int64_t even = (count + kMaxSpans - 1) / kMaxSpans;
  return std::max<int64_t>(kSpanRows, (even + kSparseKeyTile - 1) / kSparseKeyTile * kSparseKeyTile);
}
inline int64_t span_count(int64_t count) { return count <= 0 ? 0 : (count + span_rows(count) - 1) / span_rows(count); }

enum class Path { kScalar, kAvx2, kAvx512 };
// AVX-512 where the CPU has it, else AVX2 + FMA, else the scalar definition (the same bits on each).
Path best_path();

// Heads [h0, h0 + nh) (nh ≤ kMaxHeadGroup) of query t of a (its q, pages, row format, scale, Dk and Dv; a.idx,
// a.topk and a.out are not read) over the list entries [begin, end) of idx (row numbers, −1 skipped; rows
// begin..end−1 when idx is null), from a fresh state: running max m[g], sum l[g] and the unnormalised output
// out[g] (Dv floats each). Rows that are not fp32 are decoded once per tile for all nh heads. On AVX-512 the
// rows of the next tile, up to list entry prefetch_end, are prefetched while a tile is scored.
void span_state(const SparseMlaArgs& a, int64_t t, int64_t h0, int64_t nh, const int32_t* idx, int64_t begin,
                int64_t end, int64_t prefetch_end, Path path, float* m, float* l, float* const* out);

// Folds one span's state (m, l, o) into a running one (M, L, O) of one head, Dv floats: an empty span (m = −∞)
// changes nothing, into an empty running state it is copied, else with x = max(M, m), a = e(M − x) and
// b = e(m − x) (prefill_exp): L = fma(l, b, L·a), O[d] = fma(o[d], b, O[d]·a), M = x.
void merge_span(float& M, float& L, float* O, float m, float l, const float* o, int64_t Dv);

// One query of a call: its arguments, index, list of rows (null: rows 0..count−1) and list length.
struct LatentQuery {
  const SparseMlaArgs* a;
  int64_t t;
  const int32_t* idx;
  int64_t count;
};
// Every head of every query: its spans' states merged in order and normalised into a->out (O / L, 0 where
// L = 0). Queries are whole work items when there are enough of them; otherwise spans are spread over the
// threads and merged after.
void attend(std::span<const LatentQuery> queries, Path path);
// Per-thread grow-only list for building a call's queries.
std::vector<LatentQuery>& query_scratch(size_t n);

// One key tile (n ≤ kSparseKeyTile rows) of `heads` heads (1 or 2): queries q[g], running max m[g], sum l[g],
// outputs o[g]; the bits of the scalar definition's step for each head.
void tile_step_avx2(int heads, const float* const* q, const float* const* rows, int64_t n, const SparseMlaArgs& a,
                    float* m, float* l, float* const* o);

}  // namespace kestrel::kernels::sparse_tiles
