#include "disagg/region_registry.h"

#include <string>

namespace kestrel::disagg {

bool RegionRegistry::held(const void* p, size_t n) const {
  auto start = reinterpret_cast<uintptr_t>(p);
  uintptr_t end = start + n;
  auto it = held_.upper_bound(start);  // first range starting after `start`
  if (it != held_.end() && it->first < end) return true;
  if (it != held_.begin() && std::prev(it)->second > start) return true;
  return false;
}

Status RegionRegistry::advertise(uint64_t transfer_id, uint64_t endpoint_id, std::span<const HeldRange> ranges) {
  if (transfers_.count(transfer_id) != 0) {
    return invalid_argument("disagg: transfer " + std::to_string(transfer_id) + " is already advertised");
  }
  if (ranges.empty()) return invalid_argument("disagg: a transfer needs at least one range");
  std::map<uintptr_t, uintptr_t> mine;
  for (const HeldRange& r : ranges) {
    if (r.length == 0) return invalid_argument("disagg: zero-length range");
    auto start = reinterpret_cast<uintptr_t>(r.base);
    bool overlaps_mine = false;
    auto it = mine.upper_bound(start);
    if (it != mine.end() && it->first < start + r.length) overlaps_mine = true;
    if (it != mine.begin() && std::prev(it)->second > start) overlaps_mine = true;
    if (overlaps_mine || held(r.base, r.length)) {
      return invalid_argument("disagg: transfer " + std::to_string(transfer_id) +
                              ": range overlaps memory still held by a transfer (in flight or quarantined)");
    }
    mine.emplace(start, start + r.length);
  }
  held_.insert(mine.begin(), mine.end());
  transfers_[transfer_id] = {endpoint_id, false, {ranges.begin(), ranges.end()}};
  ++counts_.in_flight;
  counts_.held_ranges += ranges.size();
  return Status::ok();
}

void RegionRegistry::drop(std::unordered_map<uint64_t, Transfer>::iterator it) {
  for (const HeldRange& r : it->second.ranges) held_.erase(reinterpret_cast<uintptr_t>(r.base));
  counts_.held_ranges -= it->second.ranges.size();
  transfers_.erase(it);
}

Status RegionRegistry::complete(uint64_t transfer_id) {
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end() || it->second.failed) {
    return invalid_argument("disagg: transfer " + std::to_string(transfer_id) + " is not in flight");
  }
  --counts_.in_flight;
  ++counts_.completed;
  drop(it);
  return Status::ok();
}

Status RegionRegistry::fail(uint64_t transfer_id) {
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end()) return invalid_argument("disagg: transfer " + std::to_string(transfer_id) + " unknown");
  if (it->second.failed) return Status::ok();
  it->second.failed = true;
  --counts_.in_flight;
  ++counts_.quarantined;
  ++counts_.failed;
  return Status::ok();
}

Status RegionRegistry::release_closed(const Endpoint& ep) {
  if (!ep.closed()) {
    return unavailable("disagg: endpoint " + std::to_string(ep.id()) + " is open; its memory stays held");
  }
  if (ep.peer_may_write()) {
    return unavailable("disagg: endpoint " + std::to_string(ep.id()) +
                       " is closed but its peer's process may still write (shared memory); its memory stays held");
  }
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    if (it->second.endpoint != ep.id()) {
      ++it;
      continue;
    }
    if (!it->second.failed) {
      --counts_.in_flight;
      ++counts_.failed;
    } else {
      --counts_.quarantined;
    }
    ++counts_.released_after_close;
    auto next = std::next(it);
    drop(it);
    it = next;
  }
  return Status::ok();
}

RegistryCounts RegionRegistry::counts() const { return counts_; }

}  // namespace kestrel::disagg
