// Prefix cache index for hybrid (KDA + MLA) models: which leading blocks of a token sequence have cached MLA pages
// and where a KDA state snapshot exists (docs/architecture.md §9).
//
// Structure. One node per cached block, named by its chained key (cache/block_hash.h): key[i] already encodes the
// whole prefix of blocks 0..i, so a hash map from key to node is the index, and each node records its parent (the
// node of key[i-1], or none for block 0) and its child count. Walking a sequence is one lookup per block plus a check
// that each found node's parent is the node found one step earlier. Invariant: every ancestor of a node is cached
// (nodes are removed only as leaves), so a path is cached iff its last node is.
//
// Payload per node: `page` (the MLA/indexer page id of that block, owned by the cache: it holds one reference in the
// caller's page pool) and optionally `snapshot` (a SnapshotPool id: the KDA conv + recurrent state after the block's
// last token). A node with a page but no snapshot is a "tombstone" for state: its pages cannot end a usable hit on a
// hybrid model, because the KDA state at that boundary is unknown.
//
// Usable hit (needs_snapshot): the deepest cached node on the sequence's path that has a snapshot. Pages beyond it are
// reported (page_blocks) so the caller can snapshot there during the next prefill, but never as a hit.
//
// Eviction priority (lowest first), with tick = the logical clock of the last use (see tick()) and d = the block's depth (1 for block 0):
//     page of a leaf:  page_tick + w * log2(1 + d)     (a tombstone leaf on a hybrid model: page_tick only)
//     snapshot:        snap_tick + w * log2(1 + d)
// where w = RadixCacheConfig::depth_weight. Rationale: pages and snapshots each have a constant size in their own pool,
// so "compute saved per byte" is compute saved per entry. Re-prefilling block d costs the token-linear work (MLP, KDA)
// plus attention over a d-block prefix, and restoring a snapshot at depth d saves re-running all d blocks; both grow
// with d, so deeper entries are worth more, and the log keeps the bonus from overriding recency (each doubling of
// depth is worth w ticks of recency). A tombstone leaf saves no compute on a hybrid model (no hit can end there) until
// a snapshot is attached, so it loses the bonus. This is the recency + FLOP-efficiency rule of Marconi
// (arXiv 2411.19379) in a form that fits a heap. Only leaves are page-eviction candidates (interior pages back their
// children's hits); a snapshot can be dropped anywhere (the node keeps its page and becomes a tombstone).
//
// Complexity: each candidate set is a binary heap with lazy invalidation (an entry carries the version it was pushed
// with; touching a node pushes a new entry and stale ones are skipped when popped, compacted when the heap outgrows
// twice the live entries), so match/insert are O(blocks * log n) and evicting k pages is O(k log n + p), where p is
// the number of leaves the caller reports as not evictable (pages shared with running sequences): those are parked
// off the heap and only re-asked, once per call, whether they became evictable.
//
// Not thread-safe: owned by the scheduler thread. Callbacks must not call back into the cache.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"

namespace kestrel {

struct RadixCacheConfig {
  int64_t block_tokens = 64;    // matching granularity (independent of the physical page size; the caller maps)
  bool needs_snapshot = true;   // hybrid model: a hit needs a state snapshot at its boundary; false for pure-MLA models
  double depth_weight = 16.0;   // w in the eviction score: ticks of recency one doubling of depth is worth (>= 0)
};

class RadixCache {
 public:
  explicit RadixCache(const RadixCacheConfig& c);

  struct Match {
    int64_t blocks = 0;          // usable hit: leading blocks whose pages AND (if needs_snapshot) a snapshot at block
                                 // `blocks-1` exist
    std::vector<int32_t> pages;  // payload (page id) of each of those `blocks` blocks
    int32_t snapshot = -1;       // snapshot id at the end of the hit (-1 when !needs_snapshot or blocks == 0)
    int64_t page_blocks = 0;     // deepest leading run whose pages are cached (>= blocks): pages without a snapshot
                                 // beyond the hit ("tombstones" for state); the caller may snapshot there next time
  };
  // Never reports a hit the state cannot back. Marks the hit as used: the pages of blocks [0, blocks) and the hit's
  // snapshot get the current tick. Snapshots higher on the path and tombstone pages beyond the hit are not refreshed
  // (they were not consumed).
  Match match(std::span<const Digest> keys);
  // Records that the sequence's blocks [0, keys.size()) live in `pages` (pages.size() == keys.size()). For every block
  // the cache does not hold yet it ADOPTS the caller's page and appends it to `adopted` (the caller then adds a
  // reference to that page in its pool); blocks already cached keep the cache's page. Touches every block of the path.
  // Returns false (no change) if the key chain does not connect (a key cached under another parent, or a cached key
  // after a missing one); never happens when keys come from extend_block_keys from a root.
  bool insert(std::span<const Digest> keys, std::span<const int32_t> pages, std::vector<int32_t>& adopted);
  // Attaches snapshot `snap` (>= 0) at the node of the last key (whose whole path must be cached). Returns false when
  // `keys` is empty, that node is missing, or it already has a snapshot (the caller keeps/frees `snap`).
  bool attach_snapshot(std::span<const Digest> keys, int32_t snap);
  bool has_node(std::span<const Digest> keys) const;  // path fully cached (false for an empty path)
  bool has_snapshot(std::span<const Digest> keys) const;
  // Removes leaf nodes in priority order until `n` pages were dropped or nothing evictable is left; only nodes whose
  // page satisfies `evictable(page)` are candidates (the caller says whether dropping it frees memory, i.e. no running
  // sequence shares it). Calls drop_page(page) and, if the node had one, drop_snapshot(snap). A parent whose last child
  // goes becomes a candidate in the same call. Returns the number of pages dropped.
  int64_t evict_pages(int64_t n, const std::function<bool(int32_t)>& evictable,
                      const std::function<void(int32_t)>& drop_page, const std::function<void(int32_t)>& drop_snapshot);
  // Removes the lowest-priority snapshot (its node keeps its page). false if there is none.
  bool evict_snapshot(const std::function<void(int32_t)>& drop_snapshot);
  // Drops everything (admin "flush"): drop_page for every page, drop_snapshot for every snapshot.
  void clear(const std::function<void(int32_t)>& drop_page, const std::function<void(int32_t)>& drop_snapshot);

  int64_t cached_blocks() const { return live_; }
  int64_t snapshots() const { return snapshots_; }
  const RadixCacheConfig& config() const { return cfg_; }
  // The logical clock: advanced by one by every match, every successful non-empty insert and every successful
  // attach_snapshot.
  uint64_t tick() const { return clock_; }

 private:
  struct Node {
    Digest key{};
    int32_t parent = -1;  // node of the previous block; -1 for block 0
    int32_t page = -1;
    int32_t snapshot = -1;
    int32_t children = 0;
    int64_t depth = 0;  // blocks in the prefix this node ends (block index + 1)
    uint64_t page_tick = 0, snap_tick = 0;
    uint64_t page_ver = 0, snap_ver = 0;  // version of the node's current heap entry
    bool live = false;
  };
  struct Entry {
    double score;
    uint64_t ver;
    int32_t node;
  };
  // Keys are SHA-256 outputs, but an attacker who knows the chain root (no salt, a guessable fingerprint) could
  // search for prompts whose keys share hash buckets; a per-cache random seed mixed in makes buckets unpredictable.
  struct DigestHash {
    uint64_t seed = 0;
    size_t operator()(const Digest& d) const {
      uint64_t a, b;
      std::memcpy(&a, d.data(), sizeof a);
      std::memcpy(&b, d.data() + 8, sizeof b);
      const uint64_t x = (a ^ seed) * 0x9E3779B97F4A7C15ull;
      return static_cast<size_t>((x ^ (x >> 29)) + b);
    }
  };

  int32_t find(const Digest& k) const;
  // Nodes of the leading connected run of `keys` that is cached.
  void walk(std::span<const Digest> keys, std::vector<int32_t>& path) const;
  double page_score(const Node& n) const;
  double snap_score(const Node& n) const;
  void push_page(int32_t id);  // new candidate entry if the node is a leaf
  void push_snap(int32_t id);
  bool page_entry_valid(const Entry& e) const;
  bool snap_entry_valid(const Entry& e) const;
  void remove_leaf(int32_t id);

  RadixCacheConfig cfg_;
  std::vector<Node> nodes_;
  std::vector<int32_t> free_nodes_;
  std::unordered_map<Digest, int32_t, DigestHash> index_;
  std::vector<Entry> page_heap_, snap_heap_;  // min-heaps (std::push_heap with Later)
  std::vector<Entry> parked_;                 // page candidates last reported not evictable
  int64_t live_ = 0, snapshots_ = 0;
  uint64_t clock_ = 0, ver_ = 0;
};

}  // namespace kestrel
