// A fixed arena of KDA state snapshots for the prefix cache: `capacity` snapshots of `floats` fp32 values each
// (conv + recurrent state of every KDA layer, the same layout as one scheduler state slot). Sized once from a byte
// budget; no allocation afterwards. Plain data structure: not thread-safe (owned by the scheduler thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/result.h"

namespace kestrel {

class SnapshotPool {
 public:
  // capacity = budget_bytes / (floats_per_snapshot * 4), capped at INT32_MAX ids. A budget smaller than one
  // snapshot, or floats_per_snapshot == 0 (a model without KDA layers), gives capacity 0: acquire() then always
  // fails. Negative arguments are an error.
  static Result<std::unique_ptr<SnapshotPool>> create(int64_t floats_per_snapshot, int64_t budget_bytes);
  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;

  int64_t capacity() const { return static_cast<int64_t>(used_.size()); }
  int64_t free_count() const { return static_cast<int64_t>(free_.size()); }
  int64_t floats() const { return floats_; }
  // Bytes held by acquired snapshots ((capacity - free_count) * floats * 4).
  int64_t bytes_used() const { return (capacity() - free_count()) * floats_ * 4; }
  // Bytes of the whole arena (capacity * floats * 4).
  int64_t arena_bytes() const { return capacity() * floats_ * 4; }

  // A free snapshot id in [0, capacity), or nullopt when all are taken. Contents are undefined until written.
  std::optional<int32_t> acquire();
  // Returns `id` to the pool; KCHECK on an id out of range or not acquired (double release).
  void release(int32_t id);
  bool in_use(int32_t id) const;
  // The `floats()` values of snapshot `id` (KCHECK: acquired).
  float* data(int32_t id);
  const float* data(int32_t id) const;

 private:
  SnapshotPool() = default;
  int64_t floats_ = 0;
  std::unique_ptr<float[]> mem_;
  std::vector<int32_t> free_;  // stack; lowest ids handed out first
  std::vector<bool> used_;
};

}  // namespace kestrel
