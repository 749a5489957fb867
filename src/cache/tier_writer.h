// Asynchronous puts into a lower tier: the scheduler thread hands over an object and goes on; one background thread
// writes it. The queue is bounded in objects and bytes, and a submit that does not fit is dropped and counted
// rather than waited for: a lower tier is an optimisation, a stalled step loop is an outage. A key already waiting
// in the queue is not queued twice: that submit succeeds (the object is on its way), so a caller writing several
// objects in order goes on to the next.
//
// Shutdown either drains the queue (every queued object is put, each put bounded by the store's own timeouts) or
// drops what is still queued; both count what happened. The destructor drops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cache/tier_store.h"

namespace kestrel {

struct TierWriterOptions {
  int64_t max_queued_objects = 64;
  int64_t max_queued_bytes = 256ll << 20;
};

struct TierWriterStats {
  int64_t submitted = 0;         // accepted into the queue
  int64_t written = 0;           // puts that returned ok (new or duplicate in the store)
  int64_t failed = 0;            // puts that returned an error
  int64_t dropped_full = 0;      // submits refused: queue full
  int64_t already_queued = 0;    // submits of a key already in the queue (accepted; not queued twice)
  int64_t dropped_shutdown = 0;  // submits after shutdown, and objects still queued at a dropping shutdown
  int64_t queued = 0;            // waiting or being written now
  int64_t queued_bytes = 0;
};

class TierWriter {
 public:
  enum class Shutdown { kDrain, kDrop };

  // `store` must outlive the writer.
  TierWriter(TierStore& store, TierWriterOptions opts);
  ~TierWriter();
  TierWriter(const TierWriter&) = delete;
  TierWriter& operator=(const TierWriter&) = delete;

  // Never blocks on I/O: takes the queue lock only to append. False when the object was dropped; true when it was
  // queued now or is queued already.
  bool submit(const Digest& key, std::vector<uint8_t> bytes);
  // Blocks until the queue is empty and no put is in flight (tests, orderly stops).
  void flush();
  // Stops the thread after draining or dropping the queue; later submits are dropped. Idempotent; call it from
  // one thread (the owner).
  void shutdown(Shutdown mode);
  TierWriterStats stats() const;

 private:
  struct Item {
    Digest key;
    std::vector<uint8_t> bytes;
  };
  void run();

  TierStore& store_;
  const TierWriterOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Item> queue_;
  std::unordered_set<Digest, TierKeyHash> queued_keys_;
  bool stopping_ = false, drop_rest_ = false, busy_ = false;
  TierWriterStats stats_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace kestrel
