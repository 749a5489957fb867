#include "pd/decode_handoff.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

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

disagg::WorkerOptions DecodeHandoff::worker_options(const DecodeHandoffOptions& o) {
  disagg::WorkerOptions w = o.worker;
  if (o.arenas != nullptr) w.context = o.arenas->context();
  return w;
}

// Its transfers fail at their next poll and quarantine their memory with it; idle() destroys it when unreferenced.
void DecodeHandoff::retire(std::unique_ptr<disagg::Endpoint> ep) {
  ep->mark_failed(unavailable("hand-off: replaced by a new connection to the same prefill"));
  retired_.push_back(std::move(ep));
}

void DecodeHandoff::teardown() {
  pending_.clear();
  quarantined_.clear();
  retired_.clear();
  for (auto& r : regions_) r.reset();
}

// On the side's thread, once: every pool is registered (or, allocated by the arenas, taken as it is) for the life
// of this object.
Status DecodeHandoff::register_pools() {
  CachePools& pools = sched_.pools();
  const size_t record_bytes = static_cast<size_t>(pools.num_slots()) * kRecordBytes;
  if (opts_.arenas != nullptr) {
    auto r = opts_.arenas->allocate(record_bytes, "first-token records");
    if (!r) return r.error();
    records_ = std::move(*r);
    std::memset(records_.get(), 0, record_bytes);
  } else {
    records_ = std::shared_ptr<std::byte>(new std::byte[record_bytes](), std::default_delete<std::byte[]>());
  }
  const std::span<std::byte> arenas[] = {pools.slot_arena(), pools.mla_arena(), pools.index_arena(),
                                         {records_.get(), record_bytes}};
  for (int i = 0; i < 4; ++i) {
    if (arenas[i].empty()) continue;
    if (opts_.arenas != nullptr) {
      regions_[i] = opts_.arenas->region_of(arenas[i]);
      if (regions_[i] == nullptr)
        return invalid_argument("hand-off: the scheduler's cache pools were not allocated by the decode arenas "
                                "(CachePoolConfig::arenas must be the same object as DecodeHandoffOptions::arenas)");
      continue;
    }
    auto r = disagg::Region::map(worker(), arenas[i].data(), arenas[i].size());
    if (!r) return r.error();
    regions_[i] = std::move(*r);
  }
  return Status();
}

Result<uint64_t> DecodeHandoff::submit(GenerationRequest req, uint64_t room, uint64_t prefill) {
  auto e = std::make_shared<Entry>();
  e->room = room;
  e->prefill = prefill;
  req.handoff = Handoff::kReceive;
  req.on_cache_location = [this, e](const CacheLocation& loc) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      counts_.in_flight++;
      counts_.started++;
      e->located = true;
    }
    post([this, e, loc] { start_transfer(*e, loc); });
  };
  auto user = std::move(req.on_event);
  req.on_event = [this, e, user](const GenerationEvent& ev) {
    if (ev.finish != FinishReason::kNone) {
      bool unreserved = false;
      {
        std::lock_guard<std::mutex> lk(mu_);
        e->ended = true;
        if (e->id != 0) requests_.erase(e->id);
        unreserved = !e->located && !e->called_off;
        e->called_off = e->called_off || unreserved;
      }
      // Ended before its reservation (cancelled or failed while waiting for admission): the prefill holds the
      // request for nothing.
      if (unreserved) {
        const auto reason = ev.finish == FinishReason::kCancelled ? disagg::CancelReason::kClient
                                                                  : disagg::CancelReason::kEnded;
        post([this, e, reason] { call_off(*e, reason, opts_.transfer_timeout); });
      }
    }
    if (user) user(ev);
  };
  auto id = sched_.submit(std::move(req));
  if (id) {
    std::lock_guard<std::mutex> lk(mu_);
    e->id = *id;
    if (!e->ended) requests_[*id] = e;
  }
  return id;
}

// The flag first (start_transfer reads it: a reservation not yet advertised is never advertised), then the
// side's thread tells the prefill of a transfer under way.
void DecodeHandoff::cancel(uint64_t id) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    e = it->second;
    e->cancelled = true;
    if (!e->located) return;  // still waiting for admission: the scheduler ends it, on_event calls the room off
  }
  post([this, e] {
    for (Pending& p : pending_)
      if (p.loc.request == e->id) {
        if (!p.transfer->cancel_sent()) {
          (void)p.transfer->cancel(disagg::CancelReason::kClient, disagg::Deadline(p.until));
          std::lock_guard<std::mutex> lk(mu_);
          counts_.cancelled++;
        }
        return;
      }
  });
}

void DecodeHandoff::abandon(std::chrono::milliseconds bound) {
  // Requests still waiting for admission: a reservation that comes now is never advertised (start_transfer).
  std::vector<std::shared_ptr<Entry>> waiting;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [id, e] : requests_) {
      e->cancelled = true;
      if (!e->located && !e->ended) waiting.push_back(e);
    }
  }
  // On the side's thread, after the tasks already posted (an advertisement in the queue runs first). Every
  // advertised transfer still pending is called off, whether or not its request has ended in the scheduler (a
  // stopping scheduler ends reserved requests, but the prefill still holds the room); then the requests that
  // never got a reservation, unless their end called them off already.
  call<bool>([this, waiting, bound] {
    for (Pending& p : pending_) {
      if (p.transfer->cancel_sent()) continue;
      const auto until = std::min(p.until, disagg::Clock::now() + bound);
      if (p.transfer->cancel(disagg::CancelReason::kEnded, disagg::Deadline(until)).is_ok()) {
        std::lock_guard<std::mutex> lk(mu_);
        counts_.cancelled++;
      }
    }
    for (const auto& e : waiting) {
      bool send = false;
      {
        std::lock_guard<std::mutex> lk(mu_);
        send = !e->located && !e->called_off;
        e->called_off = true;
      }
      if (send) call_off(*e, disagg::CancelReason::kEnded, bound);
    }
    return true;
  });
}

void DecodeHandoff::call_off(const Entry& e, disagg::CancelReason reason, std::chrono::milliseconds bound) {
  disagg::Endpoint* ep = endpoint(e.prefill);
  if (ep == nullptr || ep->failed()) return;  // no connection: the prefill's own deadlines release it
  if (disagg::send_cancel(*ep, transfer_id(e.room), reason, disagg::Deadline::after(bound)).is_ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    counts_.cancelled++;
  }
}

bool DecodeHandoff::connected(uint64_t prefill) {
  return call<bool>([this, prefill] {
    disagg::Endpoint* ep = endpoint(prefill);
    return ep != nullptr && !ep->failed();
  });
}

DecodeCounts DecodeHandoff::counts() {
  auto reg = call<disagg::RegistryCounts>([this] { return registry_.counts(); });
  std::lock_guard<std::mutex> lk(mu_);
  DecodeCounts c = counts_;
  c.registry = reg;
  return c;
}

void DecodeHandoff::start_transfer(const Entry& e, const CacheLocation& loc) {
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled = e.cancelled;
  }
  if (cancelled) {
    // Cancelled before anything was advertised: no peer can write into the reservation, it returns now.
    call_off(e, disagg::CancelReason::kClient, opts_.transfer_timeout);
    {
      std::lock_guard<std::mutex> lk(mu_);
      counts_.in_flight--;
    }
    sched_.fail_received(loc.request, "cancelled before its hand-off began");
    sched_.release_reserved(loc.request);
    return;
  }
  const uint64_t room = e.room, prefill = e.prefill;
  disagg::Endpoint* ep = endpoint(prefill);
  if (ep == nullptr || ep->failed()) {
    return end(loc, nullptr, unavailable("hand-off: no open connection to prefill instance " + std::to_string(prefill)), 0);
  }
  std::vector<disagg::DestinationRange> ranges;
  uint64_t bytes = 0;
  for (const PoolRange& r : handoff_layout(sched_.pools(), loc)) {
    ranges.push_back({regions_[static_cast<int>(r.pool)].get(), r.offset, r.length});
    bytes += r.length;
  }
  auto in = std::make_unique<disagg::IncomingTransfer>(transfer_id(room), *ep, registry_, std::move(ranges));
  const auto since = disagg::Clock::now();
  const auto until = since + opts_.transfer_timeout;
  Status st = in->advertise(disagg::Deadline(until));
  if (!st.is_ok()) return end(loc, ep, st, bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    counts_.advertised++;
  }
  pending_.push_back({loc, ep, bytes, std::move(in), since, until});
}

// The transfer of `loc` ended: admit with the first token from its verified record, or fail and quarantine.
void DecodeHandoff::end(const CacheLocation& loc, disagg::Endpoint* ep, Status st, uint64_t bytes,
                        disagg::Clock::time_point since) {
  GenerationEvent first;
  if (st.is_ok()) {
    auto rec = decode_first_token(std::span<const std::byte, kRecordBytes>(
        records_.get() + static_cast<size_t>(loc.slot) * kRecordBytes, kRecordBytes));
    if (rec) first = std::move(*rec);
    else st = rec.error();  // verified bytes with a bad record: not a compatible prefill
  }
  {
    // Counted before the scheduler hears of it: a client that saw the outcome sees the counts that go with it.
    std::lock_guard<std::mutex> lk(mu_);
    counts_.in_flight--;
    if (st.is_ok()) {
      counts_.received++, counts_.bytes += bytes;
      counts_.seconds.observe(std::chrono::duration<double>(disagg::Clock::now() - since).count());
    } else {
      counts_.failed++, counts_.quarantined++, counts_.quarantined_bytes += bytes;
      const std::string& why = st.message();
      if (st.code() == StatusCode::kCorrupt) counts_.failed_corrupt++;
      else if (why.find("deadline") != std::string::npos) counts_.failed_deadline++;
      else if (why.find("the sender failed") != std::string::npos) counts_.failed_sender++;
      else counts_.failed_peer++;
    }
  }
  if (st.is_ok()) {
    sched_.admit_received(loc.request, first);
  } else {
    sched_.fail_received(loc.request, "hand-off from prefill failed: " + st.message());
    // An operator sees each failed hand-off in the log, with its reason and age (clients only see a 500).
    std::fprintf(stderr, "kestrel serve: decode: hand-off of request %llu failed after %.0f ms (%llu bytes): %s\n",
                 static_cast<unsigned long long>(loc.request),
                 std::chrono::duration<double, std::milli>(disagg::Clock::now() - since).count(),
                 static_cast<unsigned long long>(bytes), st.message().c_str());
    // The memory may still be written: it stays quarantined with the connection, which is given up now (failing
    // the other transfers on it); idle() returns the memory once the peer can no longer write.
    if (ep != nullptr) {
      ep->mark_failed(st);
      for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it)
        if (it->second.get() == ep) {
          retired_.push_back(std::move(it->second));
          endpoints_.erase(it);
          break;
        }
    }
    quarantined_.push_back({loc.request, ep, bytes});
  }
}

// The prefill's request ended before any put (cancelled there, or failed): the memory is free at once and the
// connection stays open.
void DecodeHandoff::withdraw(const CacheLocation& loc, const Status& st, bool cancel_confirmed) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    counts_.in_flight--;
    if (cancel_confirmed) counts_.cancel_confirmed++;
    else counts_.withdrawn++;
  }
  sched_.fail_received(loc.request, "the prefill instance ended the request before its hand-off (" + st.message() + ")");
  sched_.release_reserved(loc.request);
}

void DecodeHandoff::idle() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    // The prefill's queued notices renew the deadline: a request queued there longer than the deadline is not
    // failed while the prefill vouches for it (its liveness is still judged by silence and UCX errors).
    std::optional<Status> st = p.transfer->poll(disagg::Deadline(p.until), opts_.silence, opts_.transfer_timeout);
    if (!st) {
      ++i;
      continue;
    }
    Pending done = std::move(p);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    const disagg::TransferState state = done.transfer->state();
    done.transfer.reset();
    if (state == disagg::TransferState::kWithdrawn || state == disagg::TransferState::kCancelled)
      withdraw(done.loc, *st, state == disagg::TransferState::kCancelled);
    else end(done.loc, done.ep, *st, done.bytes, done.since);
  }
  // Quarantined memory returns once its peer can no longer write into it (closed endpoint; over shared memory
  // also the peer's process gone).
  for (auto& ep : retired_)
    if (!ep->closed()) (void)ep->close(disagg::Deadline::after(std::chrono::milliseconds(1)));
  for (size_t i = 0; i < quarantined_.size();) {
    disagg::Endpoint* ep = quarantined_[i].ep;
    if (ep != nullptr && ep->peer_may_write()) {
      ++i;
      continue;
    }
    if (ep != nullptr) (void)registry_.release_closed(*ep);
    {
      std::lock_guard<std::mutex> lk(mu_);
      counts_.quarantined--;
      counts_.quarantined_bytes -= quarantined_[i].bytes;
    }
    sched_.release_reserved(quarantined_[i].request);
    quarantined_.erase(quarantined_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  // A retired endpoint goes when nothing refers to it any more.
  std::erase_if(retired_, [&](const std::unique_ptr<disagg::Endpoint>& ep) {
    if (!ep->closed()) return false;
    for (const Quarantined& q : quarantined_)
      if (q.ep == ep.get()) return false;
    for (const Pending& p : pending_)
      if (p.ep == ep.get()) return false;
    return true;
  });
}

}  // namespace kestrel::pd
