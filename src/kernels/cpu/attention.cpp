#include "kernels/cpu/attention.h"

#include <vector>

#include "base/check.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/sparse_mla_tiles.h"

namespace kestrel::kernels {

namespace {

SparseMlaArgs tile_args(const AttentionArgs& a) {
  KCHECK(a.pages != nullptr && a.page_tokens > 0, "causal_attention: the rows must be paged");
  SparseMlaArgs s;
  s.T = a.T, s.H = a.H, s.Dk = a.Dk, s.Dv = a.Dv, s.q = a.q;
  s.pages = a.pages, s.page_tokens = a.page_tokens, s.row = a.row, s.scale = a.scale, s.out = a.out;
  return s;
}

}  // namespace

void causal_attention(const AttentionArgs& a) { causal_attention_many(std::span<const AttentionArgs>(&a, 1)); }

// Query t of a call attends rows 0..L−T+t: the tile kernel over that list (sparse_mla_tiles.h: attend splits
// the work into whole queries, groups of their heads, or spans of their rows).
void causal_attention_many(std::span<const AttentionArgs> args) {
  size_t queries = 0;
  for (const AttentionArgs& a : args) queries += static_cast<size_t>(a.T);
  if (queries == 0) return;
  std::vector<SparseMlaArgs>& tiles = thread_table<SparseMlaArgs, struct CallArgs>(args.size());  // per call
  std::vector<sparse_tiles::LatentQuery>& qs = sparse_tiles::query_scratch(queries);
  size_t n = 0;
  for (size_t c = 0; c < args.size(); ++c) {
    const AttentionArgs& a = args[c];
    if (a.T == 0) continue;
    tiles[c] = tile_args(a);
    for (int64_t t = 0; t < a.T; ++t) qs[n++] = {&tiles[c], t, nullptr, a.L - a.T + t + 1};
  }
  sparse_tiles::attend(std::span<const sparse_tiles::LatentQuery>(qs.data(), n), sparse_tiles::best_path());
}

}  // namespace kestrel::kernels
