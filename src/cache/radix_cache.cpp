#include "cache/radix_cache.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "base/check.h"

namespace kestrel {
namespace {

// std::push_heap builds a max-heap under `comp`; ordering "a after b" puts the lowest score (then the oldest
// entry) on top.
struct Later {
  template <typename E>
  bool operator()(const E& a, const E& b) const {
    return a.score != b.score ? a.score > b.score : a.ver > b.ver;
  }
};

// Drops stale entries once they outnumber the live candidates (amortised O(1) per push).
template <typename E, typename Valid>
void maybe_compact(std::vector<E>& heap, int64_t live, Valid valid) {
  if (static_cast<int64_t>(heap.size()) <= 2 * live + 64) return;
  std::erase_if(heap, [&](const E& e) { return !valid(e); });
  std::make_heap(heap.begin(), heap.end(), Later{});
}

}  // namespace

RadixCache::RadixCache(const RadixCacheConfig& c)
    : cfg_(c), index_(0, DigestHash{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()}) {
  KCHECK(c.block_tokens > 0, "radix cache: block_tokens must be positive");
  KCHECK(c.depth_weight >= 0 && std::isfinite(c.depth_weight), "radix cache: depth_weight must be finite and >= 0");
}

int32_t RadixCache::find(const Digest& k) const {
  auto it = index_.find(k);
  return it == index_.end() ? -1 : it->second;
}

void RadixCache::walk(std::span<const Digest> keys, std::vector<int32_t>& path) const {
  path.clear();
  int32_t prev = -1;
  for (const Digest& k : keys) {
    const int32_t id = find(k);
    if (id < 0 || nodes_[static_cast<size_t>(id)].parent != prev) break;
    path.push_back(id);
    prev = id;
  }
}

double RadixCache::page_score(const Node& n) const {
  const bool saves_compute = !cfg_.needs_snapshot || n.snapshot >= 0;
  return static_cast<double>(n.page_tick) +
         (saves_compute ? cfg_.depth_weight * std::log2(1.0 + static_cast<double>(n.depth)) : 0.0);
}

double RadixCache::snap_score(const Node& n) const {
  return static_cast<double>(n.snap_tick) + cfg_.depth_weight * std::log2(1.0 + static_cast<double>(n.depth));
}

bool RadixCache::page_entry_valid(const Entry& e) const {
  const Node& n = nodes_[static_cast<size_t>(e.node)];
  return n.live && n.children == 0 && n.page_ver == e.ver;
}

bool RadixCache::snap_entry_valid(const Entry& e) const {
  const Node& n = nodes_[static_cast<size_t>(e.node)];
  return n.live && n.snapshot >= 0 && n.snap_ver == e.ver;
}

void RadixCache::push_page(int32_t id) {
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.children != 0) return;  // pushed again when its last child goes
  n.page_ver = ++ver_;
  page_heap_.push_back({page_score(n), n.page_ver, id});
  std::push_heap(page_heap_.begin(), page_heap_.end(), Later{});
  maybe_compact(page_heap_, live_, [this](const Entry& e) { return page_entry_valid(e); });
}

void RadixCache::push_snap(int32_t id) {
  Node& n = nodes_[static_cast<size_t>(id)];
  n.snap_ver = ++ver_;
  snap_heap_.push_back({snap_score(n), n.snap_ver, id});
  std::push_heap(snap_heap_.begin(), snap_heap_.end(), Later{});
  maybe_compact(snap_heap_, snapshots_, [this](const Entry& e) { return snap_entry_valid(e); });
}

RadixCache::Match RadixCache::match(std::span<const Digest> keys) {
  std::vector<int32_t> path;
  walk(keys, path);
  Match m;
  m.page_blocks = static_cast<int64_t>(path.size());
  if (!cfg_.needs_snapshot) {
    m.blocks = m.page_blocks;
  } else {
    for (int64_t i = m.page_blocks; i > 0; --i) {
      if (nodes_[static_cast<size_t>(path[static_cast<size_t>(i - 1)])].snapshot >= 0) {
        m.blocks = i;
        break;
      }
    }
  }
  const uint64_t now = ++clock_;
  m.pages.reserve(static_cast<size_t>(m.blocks));
  for (int64_t i = 0; i < m.blocks; ++i) {
    const int32_t id = path[static_cast<size_t>(i)];
    Node& n = nodes_[static_cast<size_t>(id)];
    m.pages.push_back(n.page);
    n.page_tick = now;
    push_page(id);  // no-op unless it is a leaf
  }
  if (cfg_.needs_snapshot && m.blocks > 0) {
    const int32_t id = path[static_cast<size_t>(m.blocks - 1)];
    Node& n = nodes_[static_cast<size_t>(id)];
    m.snapshot = n.snapshot;
    n.snap_tick = now;
    push_snap(id);
  }
  return m;
}

bool RadixCache::insert(std::span<const Digest> keys, std::span<const int32_t> pages, std::vector<int32_t>& adopted) {
  KCHECK(pages.size() == keys.size(), "radix cache: insert needs one page per key");
  // Validate before changing anything: a cached prefix, then only missing keys.
  int32_t prev = -1;
  size_t cached = 0;
  bool gap = false;
  for (const Digest& k : keys) {
    const int32_t id = find(k);
    if (id < 0) {
      gap = true;
      continue;
    }
    if (gap || nodes_[static_cast<size_t>(id)].parent != prev) return false;
    prev = id;
    ++cached;
  }
  if (keys.empty()) return true;
  const uint64_t now = ++clock_;
  prev = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    int32_t id;
    if (i < cached) {
      id = find(keys[i]);
    } else {
      KCHECK(pages[i] >= 0, "radix cache: negative page id");
      id = static_cast<int32_t>(nodes_.size());
      if (!free_nodes_.empty()) {
        id = free_nodes_.back();
        free_nodes_.pop_back();
      } else {
        nodes_.emplace_back();
      }
      Node& n = nodes_[static_cast<size_t>(id)];
      n = Node{};
      n.key = keys[i];
      n.parent = prev;
      n.page = pages[i];
      n.depth = static_cast<int64_t>(i) + 1;
      n.live = true;
      KCHECK(index_.emplace(keys[i], id).second, "radix cache: the same key twice in one insert");
      if (prev >= 0) ++nodes_[static_cast<size_t>(prev)].children;
      ++live_;
      adopted.push_back(pages[i]);
    }
    nodes_[static_cast<size_t>(id)].page_tick = now;
    prev = id;
  }
  push_page(prev);  // the only node of the path that can be a leaf
  return true;
}

bool RadixCache::attach_snapshot(std::span<const Digest> keys, int32_t snap) {
  KCHECK(snap >= 0, "radix cache: negative snapshot id");
  std::vector<int32_t> path;
  walk(keys, path);
  if (keys.empty() || path.size() != keys.size()) return false;
  const int32_t id = path.back();
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.snapshot >= 0) return false;
  n.snapshot = snap;
  n.snap_tick = ++clock_;
  ++snapshots_;
  push_snap(id);
  if (cfg_.needs_snapshot) push_page(id);  // its page score gained the depth bonus
  return true;
}

bool RadixCache::has_node(std::span<const Digest> keys) const {
  std::vector<int32_t> path;
  walk(keys, path);
  return !keys.empty() && path.size() == keys.size();
}

bool RadixCache::has_snapshot(std::span<const Digest> keys) const {
  std::vector<int32_t> path;
  walk(keys, path);
  return !keys.empty() && path.size() == keys.size() && nodes_[static_cast<size_t>(path.back())].snapshot >= 0;
}

void RadixCache::remove_leaf(int32_t id) {
  Node& n = nodes_[static_cast<size_t>(id)];
  KCHECK(n.live && n.children == 0, "radix cache: removing a node that is not a leaf");
  index_.erase(n.key);
  n.live = false;
  n.snapshot = -1;
  --live_;
  free_nodes_.push_back(id);
  if (n.parent >= 0) {
    Node& p = nodes_[static_cast<size_t>(n.parent)];
    --p.children;
    push_page(n.parent);  // a new leaf: a candidate now
  }
}

int64_t RadixCache::evict_pages(int64_t n, const std::function<bool(int32_t)>& evictable,
                                const std::function<void(int32_t)>& drop_page,
                                const std::function<void(int32_t)>& drop_snapshot) {
  // Leaves the caller reported as in use wait in parked_, off the heap: each call re-asks only them (O(p) predicate
  // calls, no heap work) and returns the ones now free to the heap before choosing.
  size_t keep = 0;
  for (const Entry& e : parked_) {
    if (!page_entry_valid(e)) continue;  // touched (a newer entry exists), extended or removed since
    if (evictable(nodes_[static_cast<size_t>(e.node)].page)) {
      page_heap_.push_back(e);
      std::push_heap(page_heap_.begin(), page_heap_.end(), Later{});
    } else {
      parked_[keep++] = e;
    }
  }
  parked_.resize(keep);
  int64_t dropped = 0;
  while (dropped < n && !page_heap_.empty()) {
    std::pop_heap(page_heap_.begin(), page_heap_.end(), Later{});
    const Entry e = page_heap_.back();
    page_heap_.pop_back();
    if (!page_entry_valid(e)) continue;
    Node& node = nodes_[static_cast<size_t>(e.node)];
    if (!evictable(node.page)) {
      parked_.push_back(e);
      continue;
    }
    const int32_t page = node.page, snap = node.snapshot;
    if (snap >= 0) --snapshots_;
    remove_leaf(e.node);
    drop_page(page);
    if (snap >= 0) drop_snapshot(snap);
    ++dropped;
  }
  return dropped;
}

bool RadixCache::evict_snapshot(const std::function<void(int32_t)>& drop_snapshot) {
  while (!snap_heap_.empty()) {
    std::pop_heap(snap_heap_.begin(), snap_heap_.end(), Later{});
    const Entry e = snap_heap_.back();
    snap_heap_.pop_back();
    if (!snap_entry_valid(e)) continue;
    Node& node = nodes_[static_cast<size_t>(e.node)];
    const int32_t snap = node.snapshot;
    node.snapshot = -1;
    --snapshots_;
    if (cfg_.needs_snapshot) push_page(e.node);  // a tombstone now: its page lost the depth bonus
    drop_snapshot(snap);
    return true;
  }
  return false;
}

void RadixCache::clear(const std::function<void(int32_t)>& drop_page,
                       const std::function<void(int32_t)>& drop_snapshot) {
  std::vector<Node> nodes;
  nodes.swap(nodes_);
  free_nodes_.clear();
  index_.clear();
  page_heap_.clear();
  parked_.clear();
  snap_heap_.clear();
  live_ = snapshots_ = 0;
  for (const Node& n : nodes) {
    if (!n.live) continue;
    drop_page(n.page);
    if (n.snapshot >= 0) drop_snapshot(n.snapshot);
  }
}

}  // namespace kestrel
