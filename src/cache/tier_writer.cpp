#include "cache/tier_writer.h"

namespace kestrel {

TierWriter::TierWriter(TierStore& store, TierWriterOptions opts)
    : store_(store), opts_(opts), thread_([this] { run(); }) {}

TierWriter::~TierWriter() { shutdown(Shutdown::kDrop); }

bool TierWriter::submit(const Digest& key, std::vector<uint8_t> bytes) {
  const auto size = static_cast<int64_t>(bytes.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ++stats_.dropped_shutdown;
      return false;
    }
    if (queued_keys_.count(key) != 0) {  // the same object is on its way
      ++stats_.already_queued;
      return true;
    }
    if (stats_.queued + 1 > opts_.max_queued_objects || stats_.queued_bytes + size > opts_.max_queued_bytes) {
      ++stats_.dropped_full;
      return false;
    }
    queued_keys_.insert(key);
    queue_.push_back(Item{key, std::move(bytes)});
    ++stats_.submitted;
    ++stats_.queued;
    stats_.queued_bytes += size;
  }
  work_cv_.notify_one();
  return true;
}

void TierWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (drop_rest_ || (stopping_ && queue_.empty())) break;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    const Status st = store_.put(item.key, item.bytes);
    lock.lock();
    // The key stays marked until its put is done, so a resubmit meanwhile is not written twice.
    queued_keys_.erase(item.key);
    --stats_.queued;
    stats_.queued_bytes -= static_cast<int64_t>(item.bytes.size());
    ++(st.is_ok() ? stats_.written : stats_.failed);
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  stats_.dropped_shutdown += static_cast<int64_t>(queue_.size());
  stats_.queued = 0;
  stats_.queued_bytes = 0;
  queue_.clear();
  queued_keys_.clear();
  busy_ = false;
  idle_cv_.notify_all();
}

void TierWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void TierWriter::shutdown(Shutdown mode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (mode == Shutdown::kDrop) drop_rest_ = true;
  }
  work_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

TierWriterStats TierWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kestrel
