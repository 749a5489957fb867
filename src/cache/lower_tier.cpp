#include "cache/lower_tier.h"

namespace kestrel {

LowerTier::LowerTier(std::shared_ptr<TierStore> store, LowerTierOptions opts)
    : store_(std::move(store)),
      opts_(opts),
      writer_(opts.synchronous ? nullptr : std::make_unique<TierWriter>(*store_, opts.writer)) {
  c_.on = true;
}

LowerTier::~LowerTier() {
  if (writer_) writer_->shutdown(TierWriter::Shutdown::kDrain);
}

bool LowerTier::readable() {
  if (opts_.read_backoff.count() == 0 || std::chrono::steady_clock::now() >= retry_at_) return true;
  c_.skipped++;
  return false;
}

void LowerTier::failed_read() {
  c_.read_errors++;
  retry_at_ = std::chrono::steady_clock::now() + opts_.read_backoff;
}

std::optional<bool> LowerTier::contains(const Digest& name) {
  auto r = store_->contains(name);
  if (!r) {
    failed_read();
    return std::nullopt;
  }
  return *r;
}

TierStore::Shared LowerTier::get(const Digest& name, bool& failed) {
  auto r = store_->get_shared(name);
  failed = !r;
  if (!r) {
    failed_read();
    return nullptr;
  }
  return std::move(*r);
}

bool LowerTier::known(const Digest& name) {
  if (opts_.remote) return names_.count(name) > 0;
  auto c = store_->contains(name);
  return c && *c;
}

bool LowerTier::submit(const Digest& name, std::vector<uint8_t> bytes) {
  if (!writer_) {
    sync_submitted_++;
    if (store_->put_owned(name, std::move(bytes)).is_ok()) return true;
    sync_failed_++;
    return false;
  }
  if (!writer_->submit(name, std::move(bytes))) return false;
  if (opts_.remote && names_.insert(name).second) {
    name_order_.push_back(name);
    if (name_order_.size() > opts_.remembered_names) {
      names_.erase(name_order_.front());
      name_order_.pop_front();
    }
  }
  return true;
}

void LowerTier::fill(TierCounters& c) const {
  const TierStoreStats s = store_->stats();
  c.on = true;
  if (writer_) {
    const TierWriterStats w = writer_->stats();
    c.submitted = w.submitted;
    c.written = w.written;
    c.write_errors = w.failed;
    c.dropped = w.dropped_full + w.dropped_shutdown;
  } else {
    c.submitted = sync_submitted_.load();
    c.write_errors = sync_failed_.load();
    c.written = c.submitted - c.write_errors;
    c.dropped = 0;
  }
  c.objects = s.objects;
  c.bytes = s.bytes;
  c.evictions = s.evictions;
  c.read_bytes = s.read_bytes;
  c.write_bytes = s.write_bytes;
  c.read_ns = s.read_ns;
  c.write_ns = s.write_ns;
}

}  // namespace kestrel
