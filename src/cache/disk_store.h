// The local-disk tier (L3): one file per object under a directory, `<dir>/<k0k1>/<k2k3>/<64 hex of key>` (two levels
// of 256-way fan-out keep directories small at millions of objects).
//
// A write goes to `<dir>/tmp/` and is renamed into place, so a reader sees the whole object or none; there is no
// fsync (a crash may leave a torn file under its final name; the object checksum rejects it and the reader erases
// it). The store keeps its index in memory: key -> size, in least-recently-used order, and stays within a byte
// budget by removing the least recently used objects before each write. The index is rebuilt by scanning the
// directory at open (order from the files' access/modify times, refreshed on every read), so objects persist across
// restarts; leftover temporary files of a crashed writer are removed then. One process owns a directory at a time
// (an flock on `<dir>/LOCK`). A failed write (ENOSPC, EIO, ...) is returned as an error and counted, and its
// temporary file removed.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "cache/tier_store.h"

namespace kestrel {

struct DiskStoreOptions {
  std::string dir;                    // created if missing
  int64_t budget_bytes = 1ll << 30;   // object bytes kept (file sizes; directory overhead not counted)
  // Fault injection for tests: called before an object is written; a non-zero errno makes the write fail after
  // half the bytes, as a full disk or a failing device would.
  std::function<int(const Digest&)> write_fault;
};

class DiskStore final : public TierStore {
 public:
  static Result<std::unique_ptr<DiskStore>> open(DiskStoreOptions opts);
  ~DiskStore() override;
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  Status put(const Digest& key, std::span<const uint8_t> bytes) override;
  Result<std::optional<std::vector<uint8_t>>> get(const Digest& key) override;
  Result<bool> contains(const Digest& key) override;
  Status erase(const Digest& key) override;
  TierStoreStats stats() const override;

  // Where the object of `key` lives (whether or not it exists).
  std::string path_of(const Digest& key) const;

 private:
  struct Entry {
    int64_t size;
    std::list<Digest>::iterator lru;  // position in lru_ (front = most recent)
    uint64_t generation;              // tells a re-stored object from the one a reader looked up
  };
  explicit DiskStore(DiskStoreOptions opts) : opts_(std::move(opts)) {}
  Status scan();
  // Removes least recently used objects until `need` more bytes fit in the budget. Caller holds mu_.
  void evict_for(int64_t need);
  void drop_locked(const Digest& key);  // index only
  Status write_file(const Digest& key, std::span<const uint8_t> bytes, std::string& tmp_path);
  void count_read_error(int64_t t0);

  DiskStoreOptions opts_;
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  std::unordered_map<Digest, Entry, TierKeyHash> index_;
  std::list<Digest> lru_;
  std::unordered_set<Digest, TierKeyHash> pending_;  // writes in flight: a second put of the key is a duplicate
  int64_t bytes_ = 0;
  int64_t reserved_ = 0;  // bytes of writes in flight, already inside the budget
  uint64_t tmp_seq_ = 0;
  uint64_t generation_ = 0;
  TierStoreStats stats_;
};

}  // namespace kestrel
