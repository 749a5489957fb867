#include "pd/decode_handoff.h"

#include "disagg/transfer.h"
#include "pd/first_token.h"
#include "pd/prefill_handoff.h"

namespace kestrel::pd {

Result<std::unique_ptr<DecodeHandoff>> DecodeHandoff::create(Scheduler& scheduler, const DecodeHandoffOptions& options) {
  auto p = std::unique_ptr<DecodeHandoff>(new DecodeHandoff(scheduler, options));
  Status s = p->start([q = p.get()] { return q->register_pools(); });
  if (!s.is_ok()) return s;
  return p;
}

DecodeHandoff::~DecodeHandoff() { stop(); }

void DecodeHandoff::teardown() {
  quarantined_.clear();
  for (auto& r : regions_) r.reset();
}

// On the side's thread, once: every pool is registered for the life of this object.
Status DecodeHandoff::register_pools() {
  CachePools& pools = sched_.pools();
  const size_t record_bytes = static_cast<size_t>(pools.num_slots()) * kRecordBytes;
  records_.reset(new std::byte[record_bytes]());
  const std::span<std::byte> arenas[] = {pools.slot_arena(), pools.mla_arena(), pools.index_arena(),
                                         {records_.get(), record_bytes}};
  for (int i = 0; i < 4; ++i) {
    if (arenas[i].empty()) continue;
    auto r = disagg::Region::map(worker(), arenas[i].data(), arenas[i].size());
    if (!r) return r.error();
    regions_[i] = std::move(*r);
  }
  return Status();
}

Result<uint64_t> DecodeHandoff::submit(GenerationRequest req, uint64_t room, uint64_t prefill) {
  req.handoff = Handoff::kReceive;
  req.on_cache_location = [this, room, prefill](const CacheLocation& loc) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      counts_.in_flight++;
    }
    post([this, room, prefill, loc] { run(room, prefill, loc); });
  };
  return sched_.submit(std::move(req));
}

DecodeCounts DecodeHandoff::counts() {
  auto reg = call<disagg::RegistryCounts>([this] { return registry_.counts(); });
  std::lock_guard<std::mutex> lk(mu_);
  DecodeCounts c = counts_;
  c.registry = reg;
  return c;
}

// On the side's thread: advertise the reserved memory, wait for the verified completion, admit or fail.
void DecodeHandoff::run(uint64_t room, uint64_t prefill, const CacheLocation& loc) {
  Status st;
  uint64_t bytes = 0;
  disagg::Endpoint* ep = endpoint(prefill);
  GenerationEvent first;
  if (ep == nullptr || ep->failed()) {
    st = unavailable("hand-off: no open connection to prefill instance " + std::to_string(prefill));
  } else {
    std::vector<disagg::DestinationRange> ranges;
    for (const PoolRange& r : handoff_layout(sched_.pools(), loc)) {
      ranges.push_back({regions_[static_cast<int>(r.pool)].get(), r.offset, r.length});
      bytes += r.length;
    }
    disagg::IncomingTransfer in(transfer_id(room), *ep, registry_, std::move(ranges));
    const auto deadline = disagg::Deadline::after(opts_.transfer_timeout);
    st = in.advertise(deadline);
    if (st.is_ok()) st = in.wait(deadline, opts_.silence);
    if (st.is_ok()) {
      auto rec = decode_first_token(std::span<const std::byte, kRecordBytes>(
          records_.get() + static_cast<size_t>(loc.slot) * kRecordBytes, kRecordBytes));
      if (rec) first = std::move(*rec);
      else st = rec.error();  // verified bytes with a bad record: the peer is not a compatible prefill
    }
  }
  if (st.is_ok()) {
    sched_.admit_received(loc.request, first);
  } else {
    sched_.fail_received(loc.request, "hand-off from prefill failed: " + st.message());
    // The memory may still be written: quarantined with the connection, which is closed now (the registry
    // releases it once the peer can no longer write; idle() checks).
    auto it = endpoints_.find(prefill);
    std::unique_ptr<disagg::Endpoint> owned;
    if (it != endpoints_.end()) {
      owned = std::move(it->second);
      endpoints_.erase(it);
      owned->mark_failed(st);
      (void)owned->close(disagg::Deadline::after(std::chrono::milliseconds(1000)));
    }
    quarantined_.push_back({loc.request, std::move(owned)});
  }
  std::lock_guard<std::mutex> lk(mu_);
  counts_.in_flight--;
  if (st.is_ok()) counts_.received++, counts_.bytes += bytes;
  else counts_.failed++, counts_.quarantined++;
}

// Returns quarantined memory whose peer can no longer write into it.
void DecodeHandoff::idle() {
  for (auto it = quarantined_.begin(); it != quarantined_.end();) {
    disagg::Endpoint* ep = it->ep.get();
    if (ep != nullptr && !ep->closed()) (void)ep->close(disagg::Deadline::after(std::chrono::milliseconds(1)));
    // No endpoint: nothing was advertised for it. Otherwise the registry decides.
    if (ep != nullptr && ep->peer_may_write()) {
      ++it;
      continue;
    }
    if (ep != nullptr) (void)registry_.release_closed(*ep);
    sched_.release_reserved(it->request);
    it = quarantined_.erase(it);
    std::lock_guard<std::mutex> lk(mu_);
    counts_.quarantined--;
  }
}

}  // namespace kestrel::pd
