#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/sparse_mla_tiles.h"

namespace kestrel::kernels {

namespace {

using sparse_tiles::kMaxHeadGroup;

SparseMlaArgs tile_args(const AttentionArgs& a) {
  KCHECK(a.pages != nullptr && a.page_tokens > 0, "causal_attention: the rows must be paged");
  SparseMlaArgs s;
  s.T = a.T, s.H = a.H, s.Dk = a.Dk, s.Dv = a.Dv, s.q = a.q;
  s.pages = a.pages, s.page_tokens = a.page_tokens, s.row = a.row, s.scale = a.scale, s.out = a.out;
  return s;
}

// Per-call first work item of causal_attention_many (grows only: steady decode allocates nothing).
std::vector<int64_t>& first_item_scratch(size_t n) {
  thread_local std::vector<int64_t> f;
  if (f.size() < n) f.resize(n);
  return f;
}

}  // namespace

void causal_attention(const AttentionArgs& a) { causal_attention_many(std::span<const AttentionArgs>(&a, 1)); }

// Work items are (call, query, group of G heads). G spreads the (query, head) pairs over the threads once
// (a single decode query: each thread takes H / threads heads, so each reads the rows once), up to 16 heads,
// after which items are whole queries; dynamic scheduling evens out sequences of different lengths.
void causal_attention_many(std::span<const AttentionArgs> args) {
  int64_t pairs = 0, widest = 0, H = 1;
  for (const AttentionArgs& a : args) {
    pairs += a.T * a.H, H = std::max(H, a.H);
    if (a.row.dtype != KvCacheDtype::kF32) widest = std::max(widest, std::max(a.Dk, a.Dv));
  }
  if (pairs == 0) return;
  const int64_t threads = omp_get_max_threads();
  const int64_t G = std::clamp<int64_t>((pairs + threads - 1) / threads, 1, std::min(kMaxHeadGroup, H));
  std::vector<int64_t>& first = first_item_scratch(args.size() + 1);
  first[0] = 0;
  for (size_t s = 0; s < args.size(); ++s) first[s + 1] = first[s] + args[s].T * ((args[s].H + G - 1) / G);
  const sparse_tiles::Path path = sparse_tiles::best_path();
  auto item = [&](int64_t i) {
    const size_t s = static_cast<size_t>(std::upper_bound(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(args.size()) + 1, i) -
                                         first.begin() - 1);
    const AttentionArgs& a = args[s];
    const int64_t groups = (a.H + G - 1) / G, r = i - first[s], t = r / groups, h0 = (r % groups) * G;
    sparse_tiles::latent_heads(tile_args(a), t, h0, std::min(G, a.H - h0), nullptr, a.L - a.T + t + 1, path);
  };
  const int64_t total = first[args.size()];
  // Every thread sizes its decoded-row buffer for the widest call as it enters, whichever items it then gets.
  const size_t floats = static_cast<size_t>(kSparseKeyTile * widest);
  if (total == 1 || threads == 1) {
    for (int64_t i = 0; i < total; ++i) item(i);
    return;
  }
  parallel_for_dynamic(total, 1, [&] { if (floats > 0) thread_scratch(kScratchKvRow, floats); }, item);
}

}  // namespace kestrel::kernels
