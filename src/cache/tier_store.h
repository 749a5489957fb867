// A lower tier of the prefix cache: a store of immutable, content-addressed objects (cache/tier_object.h), named by
// a Digest (tier_store_key()). Backends: cache/host_store.h (process memory), cache/disk_store.h (local directory),
// cache/redis_store.h (shared Redis).
//
// Objects never change once written: put() of a key that is already stored does nothing, so a second writer of the
// same boundary (another request, another server sharing the store) costs one round trip and no data. Stores may
// drop objects at any time (budget, eviction by the server), so a get() miss is normal. Implementations are
// thread-safe: the asynchronous writer (cache/tier_writer.h) puts while the scheduler thread reads.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "base/result.h"
#include "cache/block_hash.h"

namespace kestrel {

// Hash of a store key for unordered containers. Keys are SHA-256 outputs, but of prompts an attacker may choose;
// a random per-container seed keeps them from searching for prompts whose keys share buckets (as radix_cache.h).
struct TierKeyHash {
  uint64_t seed = random_seed();
  size_t operator()(const Digest& d) const {
    uint64_t a, b;
    std::memcpy(&a, d.data(), sizeof a);
    std::memcpy(&b, d.data() + 8, sizeof b);
    const uint64_t x = (a ^ seed) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>((x ^ (x >> 29)) + b);
  }
  static uint64_t random_seed() {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
};

struct TierStoreStats {
  int64_t objects = 0;     // held now; -1 where the backend cannot know (a shared store)
  int64_t bytes = 0;       // held now; -1 likewise
  int64_t reads = 0;       // get() calls that completed (hit or miss)
  int64_t hits = 0;
  int64_t writes = 0;      // put() calls that stored a new object
  int64_t duplicates = 0;  // put() calls for a key already stored
  int64_t read_bytes = 0;
  int64_t write_bytes = 0;
  int64_t evictions = 0;   // objects this store removed to stay in its budget
  int64_t errors = 0;      // failed calls of any kind
  int64_t read_ns = 0;     // wall time summed over get() calls, errors included
  int64_t write_ns = 0;    // wall time summed over put() calls, errors included
};

class TierStore {
 public:
  virtual ~TierStore() = default;
  // Stores `bytes` under `key` unless it is already there.
  virtual Status put(const Digest& key, std::span<const uint8_t> bytes) = 0;
  // The object, nullopt when absent, or an error (I/O, connection, timeout).
  virtual Result<std::optional<std::vector<uint8_t>>> get(const Digest& key) = 0;
  // The same, for a store that keeps its objects in memory: shares the stored buffer instead of copying it (null
  // when absent). The default wraps get().
  using Shared = std::shared_ptr<const std::vector<uint8_t>>;
  virtual Result<Shared> get_shared(const Digest& key) {
    auto r = get(key);
    if (!r) return r.error();
    if (!*r) return Shared();
    return Shared(std::make_shared<const std::vector<uint8_t>>(std::move(**r)));
  }
  // put() of a buffer the caller gives up: a store in memory keeps it instead of copying. The default puts a view.
  virtual Status put_owned(const Digest& key, std::vector<uint8_t> bytes) { return put(key, bytes); }
  virtual Result<bool> contains(const Digest& key) = 0;
  // Removes the object (absent is fine); a reader that finds an object corrupt erases it.
  virtual Status erase(const Digest& key) = 0;
  virtual TierStoreStats stats() const = 0;
};

}  // namespace kestrel
