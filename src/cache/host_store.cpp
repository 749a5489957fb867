#include "cache/host_store.h"

#include <chrono>
#include <functional>
#include <string>

namespace kestrel {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::unique_ptr<HostStore>> HostStore::create(HostStoreOptions opts) {
  if (opts.budget_bytes <= 0) return invalid_argument("host store: budget must be positive");
  return std::unique_ptr<HostStore>(new HostStore(opts));
}

// `make` builds the stored buffer (a copy for put(), a move for put_owned()) outside the lock, so a large copy never
// holds up readers. Whether the key is new is decided again under the lock once the buffer exists.
Status HostStore::insert(const Digest& key, size_t size_u, const std::function<Shared()>& make) {
  const int64_t t0 = now_ns();
  const auto size = static_cast<int64_t>(size_u);
  if (size > opts_.budget_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
    stats_.write_ns += now_ns() - t0;
    return too_large("host store: object of " + std::to_string(size) + " bytes exceeds the budget of " +
                     std::to_string(opts_.budget_bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(key) != 0) {
      ++stats_.duplicates;
      stats_.write_ns += now_ns() - t0;
      return Status::ok();
    }
  }
  Shared buf = make();
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key) != 0) {  // another writer of the same key got there first
    ++stats_.duplicates;
    stats_.write_ns += now_ns() - t0;
    return Status::ok();
  }
  while (!lru_.empty() && bytes_ + size > opts_.budget_bytes) {
    auto victim = index_.find(lru_.back());
    bytes_ -= static_cast<int64_t>(victim->second.bytes->size());
    index_.erase(victim);
    lru_.pop_back();
    ++stats_.evictions;
  }
  lru_.push_front(key);
  index_.emplace(key, Entry{std::move(buf), lru_.begin()});
  bytes_ += size;
  ++stats_.writes;
  stats_.write_bytes += size;
  stats_.write_ns += now_ns() - t0;
  return Status::ok();
}

Status HostStore::put(const Digest& key, std::span<const uint8_t> bytes) {
  return insert(key, bytes.size(),
                [&] { return std::make_shared<const std::vector<uint8_t>>(bytes.begin(), bytes.end()); });
}

Status HostStore::put_owned(const Digest& key, std::vector<uint8_t> bytes) {
  const size_t size = bytes.size();
  return insert(key, size, [&] { return std::make_shared<const std::vector<uint8_t>>(std::move(bytes)); });
}

TierStore::Shared HostStore::find_and_touch(const Digest& key) {
  const int64_t t0 = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.reads;
  auto it = index_.find(key);
  Shared out;
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    out = it->second.bytes;
    ++stats_.hits;
    stats_.read_bytes += static_cast<int64_t>(out->size());
  }
  stats_.read_ns += now_ns() - t0;
  return out;
}

Result<std::optional<std::vector<uint8_t>>> HostStore::get(const Digest& key) {
  Shared s = find_and_touch(key);
  if (!s) return std::optional<std::vector<uint8_t>>();
  return std::optional<std::vector<uint8_t>>(*s);
}

Result<TierStore::Shared> HostStore::get_shared(const Digest& key) { return find_and_touch(key); }

Result<bool> HostStore::contains(const Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(key) != 0;
}

void HostStore::touch(const Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
}

Status HostStore::erase(const Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return Status::ok();
  bytes_ -= static_cast<int64_t>(it->second.bytes->size());
  lru_.erase(it->second.lru);
  index_.erase(it);
  return Status::ok();
}

TierStoreStats HostStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStoreStats s = stats_;
  s.objects = static_cast<int64_t>(index_.size());
  s.bytes = bytes_;
  return s;
}

}  // namespace kestrel
