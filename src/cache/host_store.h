// The host-memory tier (L2) of the prefix cache: objects kept in this process's memory, beyond the live pools'
// budget, within a byte budget of their own by least-recently-used eviction (docs/architecture.md §3, "Host-memory
// tier"). Nothing persists: the store lives as long as the process.
//
// Each object is one immutable buffer shared by reference: get_shared() hands out the stored buffer itself (the
// reader keeps it alive even if the object is evicted meanwhile), put_owned() keeps the caller's buffer, so a
// restore copies the payload once, from this buffer into the pool's blocks. get() and put() copy, as the interface
// asks. An object larger than the whole budget is refused (an error, counted); otherwise the least recently used
// objects go until it fits. get(), get_shared() and touch() make an object the most recently used; contains() does
// not (a lookup probes boundaries it may not read). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "cache/tier_store.h"

namespace kestrel {

struct HostStoreOptions {
  int64_t budget_bytes = 256ll << 20;  // object bytes kept (the buffers; the index's own memory not counted)
};

class HostStore final : public TierStore {
 public:
  static Result<std::unique_ptr<HostStore>> create(HostStoreOptions opts);
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  Status put(const Digest& key, std::span<const uint8_t> bytes) override;
  Status put_owned(const Digest& key, std::vector<uint8_t> bytes) override;
  Result<std::optional<std::vector<uint8_t>>> get(const Digest& key) override;
  Result<Shared> get_shared(const Digest& key) override;
  Result<bool> contains(const Digest& key) override;
  Status erase(const Digest& key) override;
  TierStoreStats stats() const override;
  // Makes the object (if held) the most recently used without reading it: the prefix cache calls it when the live
  // pools serve a boundary this store also holds, so the order here follows use in every tier.
  void touch(const Digest& key);
  int64_t budget_bytes() const { return opts_.budget_bytes; }

 private:
  struct Entry {
    Shared bytes;
    std::list<Digest>::iterator lru;  // position in lru_ (front = most recent)
  };
  explicit HostStore(HostStoreOptions opts) : opts_(opts) {}
  Status insert(const Digest& key, size_t size, const std::function<Shared()>& make);
  Shared find_and_touch(const Digest& key);  // counts the read

  const HostStoreOptions opts_;
  mutable std::mutex mu_;
  std::unordered_map<Digest, Entry, TierKeyHash> index_;
  std::list<Digest> lru_;
  int64_t bytes_ = 0;
  TierStoreStats stats_;
};

}  // namespace kestrel
