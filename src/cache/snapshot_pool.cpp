#include "cache/snapshot_pool.h"

#include <algorithm>
#include <limits>
#include <string>

#include "base/check.h"

namespace kestrel {

Result<std::unique_ptr<SnapshotPool>> SnapshotPool::create(int64_t floats_per_snapshot, int64_t budget_bytes) {
  if (floats_per_snapshot < 0 || budget_bytes < 0)
    return invalid_argument("snapshot pool: negative size (floats " + std::to_string(floats_per_snapshot) +
                            ", budget " + std::to_string(budget_bytes) + " bytes)");
  if (floats_per_snapshot > std::numeric_limits<int64_t>::max() / 4)
    return invalid_argument("snapshot pool: snapshot size overflows");
  auto p = std::unique_ptr<SnapshotPool>(new SnapshotPool());
  p->floats_ = floats_per_snapshot;
  const int64_t cap = floats_per_snapshot == 0
                          ? 0
                          : std::min<int64_t>(budget_bytes / (floats_per_snapshot * 4),
                                              std::numeric_limits<int32_t>::max());
  // Default-initialised (new float[n]): pages are touched only when a snapshot is written, so the resident size
  // follows the load, not the budget.
  if (cap > 0) p->mem_.reset(new float[static_cast<size_t>(cap * floats_per_snapshot)]);
  p->used_.assign(static_cast<size_t>(cap), false);
  p->free_.reserve(static_cast<size_t>(cap));
  for (int64_t i = cap - 1; i >= 0; --i) p->free_.push_back(static_cast<int32_t>(i));
  return p;
}

std::optional<int32_t> SnapshotPool::acquire() {
  if (free_.empty()) return std::nullopt;
  const int32_t id = free_.back();
  free_.pop_back();
  used_[static_cast<size_t>(id)] = true;
  return id;
}

bool SnapshotPool::in_use(int32_t id) const { return id >= 0 && id < capacity() && used_[static_cast<size_t>(id)]; }

void SnapshotPool::release(int32_t id) {
  KCHECK(id >= 0 && id < capacity(), "snapshot pool: release of an id out of range");
  KCHECK(used_[static_cast<size_t>(id)], "snapshot pool: double release of a snapshot");
  used_[static_cast<size_t>(id)] = false;
  free_.push_back(id);
}

float* SnapshotPool::data(int32_t id) {
  KCHECK(in_use(id), "snapshot pool: data() of a snapshot not acquired");
  return mem_.get() + static_cast<int64_t>(id) * floats_;
}

const float* SnapshotPool::data(int32_t id) const {
  KCHECK(in_use(id), "snapshot pool: data() of a snapshot not acquired");
  return mem_.get() + static_cast<int64_t>(id) * floats_;
}

}  // namespace kestrel
