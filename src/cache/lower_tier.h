// One lower tier of the prefix cache as the prefix cache uses it (docs/architecture.md §3, "Lower tiers"): a store
// (the host memory of L2, the disk directory of L3 or the shared Redis of L4), the asynchronous writer that puts into
// it (none for a synchronous tier: host memory, where a put is a copy the caller makes anyway), and the counts of
// what lookups found there. The prefix cache decides what to look up and what to write; this holds the per-tier
// policy: how a read error is handled (the tier is left alone for a back-off period, so a dead or stalled server
// costs one bounded wait, not one per boundary and admission) and how a writer knows an object is already stored
// (a local store is asked; a remote one is not, to keep round trips off the step loop: the names this process
// handed to the writer are remembered instead, a bounded set).
//
// Lookups and writes are called from the scheduler thread only; flush() and fill() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "cache/tier_store.h"
#include "cache/tier_writer.h"

namespace kestrel {

// What one tier did; all zero for a tier that is not configured. The lookup counts are kept on the scheduler
// thread, the write and store counts are read from the writer and the store (fill()).
struct TierCounters {
  bool on = false;
  int64_t queries = 0;      // admissions that looked in this tier for a deeper prefix than the best so far
  int64_t hits = 0, hit_tokens = 0;  // admissions restored from this tier, tokens restored
  int64_t corrupt = 0;      // objects that failed verification (checksum, identity, shape): erased
  int64_t incomplete = 0;   // boundaries with only one of their two objects (pages, snapshot), or gone when read
  int64_t read_errors = 0;  // store errors on lookup or read (I/O, connection, timeout): the lookup stops there
  int64_t skipped = 0;      // lookups not made: the tier is backing off after a read error
  int64_t no_room = 0;      // verified hits skipped: the pools had no room for their blocks
  int64_t submitted = 0, written = 0, write_errors = 0;  // objects handed to / put by the writer, failed puts
  int64_t dropped = 0;      // objects the writer dropped (queue full, shutdown)
  int64_t objects = 0, bytes = 0;  // held now (-1: a shared store that cannot know)
  int64_t evictions = 0;    // objects the store removed for its budget
  int64_t read_bytes = 0, write_bytes = 0;  // object bytes read and written by this process
  int64_t read_ns = 0, write_ns = 0;        // wall time of reads and writes, summed
  int64_t lookup_ns = 0, lookup_max_ns = 0;  // time admissions waited on this tier (lookups and reads): sum, longest
};

struct LowerTierOptions {
  TierWriterOptions writer;
  // A remote store: whether an object is stored is not asked before writing (see above).
  bool remote = false;
  // Puts run on the caller's thread, never dropped (host memory): no writer, no queue.
  bool synchronous = false;
  // After a read error, lookups skip the tier for this long (0: never skip).
  std::chrono::milliseconds read_backoff{0};
  size_t remembered_names = 1 << 16;  // remote: names remembered as written
};

class LowerTier {
 public:
  LowerTier(std::shared_ptr<TierStore> store, LowerTierOptions opts);
  // Drains the writer: an orderly stop keeps what was computed (each put bounded by the store's own timeouts).
  ~LowerTier();
  LowerTier(const LowerTier&) = delete;
  LowerTier& operator=(const LowerTier&) = delete;

  // Lookups. Whether the tier may be read now; counts a skipped lookup when it is backing off.
  bool readable();
  // Whether `name` is stored; nullopt on a store error (counted; starts the back-off).
  std::optional<bool> contains(const Digest& name);
  // The object's bytes (shared, not copied, by a store in memory); null when absent; an error is counted, starts
  // the back-off and leaves `failed` set.
  TierStore::Shared get(const Digest& name, bool& failed);
  void erase(const Digest& name) { (void)store_->erase(name); }
  TierCounters& counters() { return c_; }

  // Writes. Whether `name` is stored or already handed to the writer.
  bool known(const Digest& name);
  // Hands the object to the writer (never waits; a synchronous tier puts it now); false when it was dropped (or,
  // synchronous, refused).
  bool submit(const Digest& name, std::vector<uint8_t> bytes);

  // Any thread: waits until every queued object is written; fills the writer's and the store's counts into `c`.
  void flush() {
    if (writer_) writer_->flush();
  }
  void fill(TierCounters& c) const;

 private:
  void failed_read();

  std::shared_ptr<TierStore> store_;
  LowerTierOptions opts_;
  std::unique_ptr<TierWriter> writer_;  // after the store: it puts into it; null for a synchronous tier
  std::atomic<int64_t> sync_submitted_{0}, sync_failed_{0};  // a synchronous tier's puts
  TierCounters c_;
  std::chrono::steady_clock::time_point retry_at_{};
  std::unordered_set<Digest, TierKeyHash> names_;
  std::deque<Digest> name_order_;
};

}  // namespace kestrel
