// The prefix cache of a hybrid model, on top of the live pools (docs/architecture.md §3, "Prefix cache"):
// a radix tree of full token blocks (RadixCache) whose nodes hold MLA/indexer block ids of CachePools and,
// at chosen boundaries, a snapshot of the KDA state (conv + recurrent of every KDA layer) in its own pool.
// A hit is usable only where the pages AND a snapshot exist at the same token boundary; a pure-MLA model
// needs no snapshot. The block size is the pool's page size: a hit always ends on a page boundary, so a
// sequence that resumes from it writes only into its own pages (shared pages are read-only).
//
// Exactness: hits and snapshots sit on a grid of `grid` tokens, the scheduler's prefill chunk (a multiple of
// the block). A warm request then runs exactly the chunks a cold one runs after the hit, on identical cached
// bits, so its logits equal the cold run's bit for bit.
// What is kept (snapshot admission): the prompt end of every request floored to the grid (the next turn's
// prefix), and a branch point (the deepest cached page of a new request's prefix that has no snapshot yet,
// floored to the grid) on its second sighting. Optionally the generation end of every finished request, at a
// block boundary: a deeper hit, but that state was computed token by token in decode, which rounds
// differently from the chunked prefill a cold run uses (within the recurrent-vs-chunked KDA tolerance).
//
// Plain data structure, owned by the scheduler thread (not thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "cache/cache_pools.h"
#include "cache/radix_cache.h"
#include "cache/snapshot_pool.h"

namespace kestrel {

// Test-only fault injection: what a defective snapshot would look like. A warm run must then differ from
// the cold one (tests prove the snapshot carries the state).
enum class SnapshotFault { kNone, kZero, kStale, kOneTokenLate };

struct PrefixCacheConfig {
  int64_t snapshot_budget_bytes = 256ll << 20;  // the KDA snapshot pool
  bool generation_snapshots = false;            // also keep the state at each request's generation end
  SnapshotFault fault = SnapshotFault::kNone;
};

struct PrefixCacheStats {
  int64_t queries = 0, query_tokens = 0, hit_tokens = 0;  // lookups, prompt tokens asked, tokens reused
  int64_t cached_blocks = 0, snapshots = 0, snapshot_bytes = 0, snapshot_capacity = 0;
  int64_t evicted_blocks = 0, evicted_snapshots = 0;  // by pool pressure
  int64_t flushes = 0;
};

class PrefixCache {
 public:
  static Result<std::unique_ptr<PrefixCache>> create(CachePools& pools, const PrefixCacheConfig& c);

  int64_t block_tokens() const { return radix_.config().block_tokens; }
  bool needs_snapshot() const { return radix_.config().needs_snapshot; }
  SnapshotFault fault() const { return cfg_.fault; }
  bool generation_snapshots() const { return cfg_.generation_snapshots && needs_snapshot(); }

  struct Lookup {
    int64_t tokens = 0;       // prefix tokens attached to the sequence (a multiple of block_tokens)
    int64_t page_tokens = 0;  // prefix whose pages are cached (>= tokens): a branch point beyond the hit
  };
  // At admission of a fresh sequence `s` in `slot`: finds the longest usable cached prefix among the first
  // `max_blocks` keys (a pure-MLA model's hit floored to a multiple of `grid_blocks`) and attaches it: its blocks join s's page table (one more reference each) and the
  // snapshot is copied into the slot (the shared snapshot is never written).
  Lookup attach(std::span<const Digest> keys, int64_t max_blocks, int64_t grid_blocks, SequenceState& s,
                std::vector<int32_t>& blocks, int slot);
  // Records the sequence's first keys.size() blocks (pages only; the cache takes a reference on each block
  // it did not hold).
  void store_pages(std::span<const Digest> keys, std::span<const int32_t> blocks);
  // Records blocks [0, keys.size()) and `state` (slot_floats floats: the KDA state after exactly
  // keys.size() * block_tokens tokens) as the snapshot at that boundary. No-op for pure-MLA models or when
  // the snapshot pool cannot make room.
  void store_snapshot(std::span<const Digest> keys, std::span<const int32_t> blocks, const float* state);
  // Held snapshots: a running sequence copies its state at block boundaries during decode into one it holds,
  // and commits it when it finishes (generation end). hold() evicts a cached snapshot if the pool is full.
  std::optional<int32_t> hold();
  float* held_data(int32_t id) { return snaps_->data(id); }
  void commit(std::span<const Digest> keys, std::span<const int32_t> blocks, int32_t held);
  void release_held(int32_t held) { snaps_->release(held); }
  // Frees cached blocks that no running sequence uses until the pools have `n_blocks` free blocks (or
  // nothing more can go). Returns whether they have.
  bool make_room(int64_t n_blocks);
  // Drops every cached block and snapshot (admin flush).
  void clear();
  PrefixCacheStats stats() const;

 private:
  PrefixCache(CachePools& pools, const PrefixCacheConfig& c, const RadixCacheConfig& rc)
      : pools_(pools), cfg_(c), radix_(rc) {}
  bool free_a_snapshot();

  CachePools& pools_;
  PrefixCacheConfig cfg_;
  RadixCache radix_;
  std::unique_ptr<SnapshotPool> snaps_;
  std::vector<int32_t> adopted_;
  PrefixCacheStats st_;
};

}  // namespace kestrel
