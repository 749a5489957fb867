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
// Lower tiers (optional): the host-memory tier (L2, this process's memory beyond the pools), the disk tier (L3, a
// local directory) and the Redis tier (L4, a server several Kestrel servers share), any of them (cache/lower_tier.h).
// Every snapshot stored at a grid boundary (a pure-MLA model: the deepest grid boundary of each retired prefix
// computed in whole grid chunks) is also written down to every configured tier as objects of cache/tier_object.h:
// the pages of all blocks from the start to the boundary, as segments of at most tier_object_bytes each
// (cache/tier_segments.h: a longer prefix reuses the segments of the shorter ones it extends, only the segments a
// tier lacks are written), and the snapshot. Host memory takes
// them at once, on this thread (so it holds every boundary the live pools hold, and an eviction from the pools needs
// no copy: the boundary is already there); the disk and Redis through one asynchronous writer each that drops when
// its queue is full. A hit in the live pools refreshes the boundary's recency in host memory.
// At admission, when the live hit is shorter, host memory, the disk and then Redis are asked for a deeper grid
// boundary whose objects (every segment and the snapshot) exist and verify (checksum, key, model digest, shape); the
// deepest one found is read
// back into fresh blocks (all of them: the sequence uses the object's bits only) and the slot, and the blocks of keys
// the radix index lacks are inserted into it. A hit from a tier is also written to the tiers before it. Anything
// missing, corrupt, late (a store error or timeout) or short of room means no hit from that tier (counted), never a
// partial one.
//
// Plain data structure, owned by the scheduler thread (not thread-safe), except flush_tier() and tier_stats().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "cache/cache_pools.h"
#include "cache/disk_store.h"
#include "cache/host_store.h"
#include "cache/lower_tier.h"
#include "cache/radix_cache.h"
#include "cache/snapshot_pool.h"
#include "cache/tier_object.h"
#include "cache/tier_segments.h"
#include "cache/tier_writer.h"

namespace kestrel {

// Test-only fault injection: what a defective snapshot would look like. A warm run must then differ from
// the cold one (tests prove the snapshot carries the state).
enum class SnapshotFault { kNone, kZero, kStale, kOneTokenLate };

struct PrefixCacheConfig {
  int64_t snapshot_budget_bytes = 256ll << 20;  // the KDA snapshot pool
  bool generation_snapshots = false;            // also keep the state at each request's generation end
  SnapshotFault fault = SnapshotFault::kNone;
  // The host-memory tier (L2): objects kept in this process's memory within this byte budget (0: no host tier),
  // least recently used first out. `host_store`, when set, is used instead of a new store (tests reach into it).
  int64_t host_budget_bytes = 0;
  std::shared_ptr<HostStore> host_store;
  // The disk tier (L3): a directory the objects persist in across restarts (empty: no disk tier), within a
  // byte budget (least recently used objects go first).
  std::string disk_dir;
  int64_t disk_budget_bytes = 4ll << 30;
  TierWriterOptions disk_writer;  // the write-down queue (full: the object is dropped, the step loop never waits)
  // The Redis tier (L4): a Redis server at redis_host:redis_port (empty host: no Redis tier). Every connect and
  // command is bounded by redis_timeout_ms; after a failed read the tier is not asked again for redis_backoff.
  std::string redis_host;
  int redis_port = 6379;
  int redis_timeout_ms = 200;
  std::string redis_key_prefix = "kestrel:v1:";
  std::chrono::milliseconds redis_backoff{1000};
  TierWriterOptions redis_writer;
  // The lower tiers hold a boundary's pages in objects of whole blocks of at most this many bytes (at least one
  // block each; cache/tier_segments.h).
  int64_t tier_object_bytes = 4ll << 20;
};

struct PrefixCacheStats {
  int64_t queries = 0, query_tokens = 0, hit_tokens = 0;  // lookups, prompt tokens asked, tokens reused
  int64_t cached_blocks = 0, snapshots = 0, snapshot_bytes = 0, snapshot_capacity = 0;
  int64_t evicted_blocks = 0, evicted_snapshots = 0;  // by pool pressure
  int64_t flushes = 0;
  // The lower tiers (all zero where not configured). hit_tokens above includes their hit_tokens.
  TierCounters host, disk, redis;
};

class PrefixCache {
 public:
  // `fingerprint`: the model identity the key chain is seeded with (stored and verified as the objects' model
  // digest); `grid_blocks`: the hit grid in blocks (where a pure-MLA model writes down).
  static Result<std::unique_ptr<PrefixCache>> create(CachePools& pools, const PrefixCacheConfig& c,
                                                     std::string_view fingerprint = {}, int64_t grid_blocks = 1);
  ~PrefixCache();

  int64_t block_tokens() const { return radix_.config().block_tokens; }
  // Blocks per pages object in the lower tiers (cache/tier_segments.h).
  int64_t tier_segment_blocks() const { return segment_blocks_; }
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
  // Pure-MLA models with a lower tier: queues the pages of blocks [0, keys.size()) as that boundary's object. The
  // caller passes a grid boundary up to which the blocks were computed in whole grid chunks (not in a prompt's
  // short last chunk, not in decode), so that the object holds the bits a cold prefill computes. No-op otherwise.
  void write_down_pages(std::span<const Digest> keys, std::span<const int32_t> blocks);
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
  // Lower tiers, callable from any thread: waits until every queued object is written (tests, orderly stops), and
  // fills the writers' and the stores' counters into `s`.
  void flush_tier();
  void tier_stats(PrefixCacheStats& s) const;

 private:
  PrefixCache(CachePools& pools, const PrefixCacheConfig& c, const RadixCacheConfig& rc)
      : pools_(pools), cfg_(c), radix_(rc) {}
  bool free_a_snapshot();
  // Queues the pages of blocks [0, keys.size()) and, for a hybrid model, `state` as that boundary's objects, to
  // every tier that does not hold them yet (to `only`, when given).
  void write_down(std::span<const Digest> keys, std::span<const int32_t> blocks, const float* state,
                  LowerTier* only = nullptr);
  // A verified boundary of one tier: its block count, its objects, and their bytes as stored.
  struct Found {
    int64_t blocks = 0;
    // Verified, in place: into the buffers beside them. The pages: one object per segment, in block order.
    std::vector<TierObjectView> pages;
    std::vector<TierStore::Shared> pages_raw;
    std::vector<Digest> pages_names;
    TierObjectView snap;
    TierStore::Shared snap_raw;
  };
  // The deepest boundary on the grid in (have, keys.size()] that `tier` holds whole and verified; 0 blocks for none.
  Found find(LowerTier& tier, std::span<const Digest> keys, int64_t have, int64_t grid_blocks);
  // Reads the object `name` and verifies it as the `kind` object of `key` (pages: of exactly `blocks` blocks);
  // a corrupt one is counted and erased.
  bool load(LowerTier& tier, const Digest& name, const Digest& key, TierPayloadKind kind, int64_t blocks,
            TierObjectView& out, TierStore::Shared& raw);
  // Restores the deepest verified boundary of any tier deeper than `have` into the radix index (and its snapshot
  // into `slot`); returns its block count, 0 for none. Sets `evicted` when it made room.
  // `ids` gets the restored blocks (one allocation reference each, the index's for those it adopted, listed
  // otherwise in `own`).
  int64_t restore(std::span<const Digest> keys, int64_t have, int64_t grid_blocks, int slot, bool& evicted,
                  std::vector<int32_t>& ids, std::vector<int32_t>& own);

  CachePools& pools_;
  PrefixCacheConfig cfg_;
  RadixCache radix_;
  std::unique_ptr<SnapshotPool> snaps_;
  std::vector<int32_t> adopted_;
  PrefixCacheStats st_;
  // Lower tiers, in lookup order (host memory, disk, Redis).
  std::shared_ptr<HostStore> host_store_;
  std::unique_ptr<LowerTier> host_, disk_, redis_;
  std::vector<LowerTier*> tiers_;
  Digest model_{};
  int64_t grid_blocks_ = 1;
  int64_t segment_blocks_ = 1;  // blocks per pages object in the lower tiers
};

}  // namespace kestrel
