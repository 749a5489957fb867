#include "chat/bpe.h"

#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <queue>

#include "base/check.h"

namespace kestrel::chat {

namespace {

constexpr int32_t kNone = INT32_MAX;
constexpr size_t kHeapThreshold = 128;  // bytes; below this the O(n^2) rescan is faster

int32_t pair_rank(const Vocab& v, std::string_view s, size_t a, size_t c) {
  const int32_t r = v.rank(s.data() + a, c - a);
  return r < 0 ? kNone : r;
}

// tiktoken's `_byte_pair_merge`: parts[i] = {start, rank of bytes[start_i, start_{i+2})}.
void merge_small(const Vocab& v, std::string_view s, std::vector<int32_t>& out) {
  const size_t n = s.size();
  std::array<std::pair<uint32_t, int32_t>, kHeapThreshold + 1> parts;
  size_t m = n + 1;
  for (size_t i = 0; i + 1 < n; ++i) parts[i] = {static_cast<uint32_t>(i), pair_rank(v, s, i, i + 2)};
  parts[n - 1] = {static_cast<uint32_t>(n - 1), kNone};
  parts[n] = {static_cast<uint32_t>(n), kNone};
  auto rank_at = [&](size_t i) {  // rank of parts[i] merged with parts[i+1], given current m
    return i + 3 < m ? pair_rank(v, s, parts[i].first, parts[i + 3].first) : kNone;
  };
  while (m > 2) {
    int32_t best = kNone;
    size_t bi = 0;
    for (size_t i = 0; i + 2 < m; ++i) {
      if (parts[i].second < best) best = parts[i].second, bi = i;
    }
    if (best == kNone) break;
    parts[bi].second = rank_at(bi);
    if (bi > 0) parts[bi - 1].second = rank_at(bi - 1);
    std::copy(parts.begin() + bi + 2, parts.begin() + m, parts.begin() + bi + 1);
    --m;
  }
  for (size_t i = 0; i + 1 < m; ++i) {
    const int32_t id = v.rank(s.data() + parts[i].first, parts[i + 1].first - parts[i].first);
    KCHECK(id >= 0, "bpe: unmerged part is not a token (vocabulary lacks a single byte)");
    out.push_back(id);
  }
}

// Same result via a min-heap of (rank, start) with lazy invalidation; node index == start byte.
void merge_large(const Vocab& v, std::string_view s, std::vector<int32_t>& out) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  std::vector<uint32_t> next(n), prev(n);
  std::vector<int32_t> rank(n, kNone);  // rank of node i merged with next[i]
  for (uint32_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i == 0 ? UINT32_MAX : i - 1;
  auto end_of = [&](uint32_t i) { return i < n ? next[i] : n; };
  using Item = std::pair<int32_t, uint32_t>;
  std::vector<Item> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap(std::greater<Item>(),
                                                                        std::move(heap_storage));
  for (uint32_t i = 0; i + 1 < n; ++i) {
    rank[i] = pair_rank(v, s, i, end_of(i + 1));
    if (rank[i] != kNone) heap.push({rank[i], i});
  }
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    if (rank[i] != r || next[i] >= n) continue;  // stale, or node was merged away (rank reset to kNone)
    const uint32_t j = next[i];
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    rank[j] = kNone;
    next[j] = n;  // j is dead
    rank[i] = next[i] < n ? pair_rank(v, s, i, end_of(next[i])) : kNone;
    if (rank[i] != kNone) heap.push({rank[i], i});
    if (prev[i] != UINT32_MAX) {
      const uint32_t p = prev[i];
      rank[p] = pair_rank(v, s, p, end_of(i));
      if (rank[p] != kNone) heap.push({rank[p], p});
    }
  }
  for (uint32_t i = 0; i < n; i = next[i]) {
    const int32_t id = v.rank(s.data() + i, next[i] - i);
    KCHECK(id >= 0, "bpe: unmerged part is not a token (vocabulary lacks a single byte)");
    out.push_back(id);
  }
}

}  // namespace

void bpe_encode(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  if (piece.empty()) return;
  const int32_t whole = vocab.rank(piece);
  if (whole >= 0) {
    out.push_back(whole);
    return;
  }
  if (piece.size() <= kHeapThreshold) {
    merge_small(vocab, piece, out);
  } else {
    merge_large(vocab, piece, out);
  }
}

}  // namespace kestrel::chat
