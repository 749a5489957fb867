#include "pd/prefill_handoff.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "disagg/transfer.h"
#include "pd/first_token.h"

namespace kestrel::pd {

using std::chrono::milliseconds;

uint64_t transfer_id(uint64_t room) { return room | (uint64_t{1} << 63); }

struct PrefillHandoff::Job {
  uint64_t room = 0;
  GenerationEvent first;
  CacheLocation loc;
  std::atomic<bool> parked{false};      // set on the scheduler thread, read on the side's
  std::atomic<bool> cancelled{false};   // set by cancel(), read on the side's thread
  uint64_t id = 0;                      // mu_
  bool ended = false;                   // mu_: the final event went out
  bool released = false;                // side's thread: finish() ran (release_parked sent)
  disagg::Clock::time_point parked_at{};
  disagg::Clock::time_point until{};  // destinations deadline, from parking
};

Result<std::unique_ptr<PrefillHandoff>> PrefillHandoff::create(Scheduler& scheduler, const PrefillHandoffOptions& options) {
  auto p = std::unique_ptr<PrefillHandoff>(new PrefillHandoff(scheduler, options));
  CachePools& pools = scheduler.pools();
  const size_t largest = static_cast<size_t>(std::max({pools.mla_block_bytes(), pools.index_block_bytes(),
                                                       pools.slot_bytes(), static_cast<int64_t>(kRecordBytes)}));
  if (!options.zeroed_parts.empty()) p->zeros_.assign(largest, std::byte{0});
  PrefillHandoff* self = p.get();
  Status s = p->start([self, &options] {
    // A decode instance's keys are unpacked when its destinations arrive, not when the transfer begins (maybe
    // after the prompt has run for seconds): see unpack_keys.
    self->worker().on_arrival(disagg::MessageKind::kDestinations,
                              [self](const disagg::Message& m) { self->unpack_keys(m); });
    // Over tcp decode instances connect to this listener (UCX client-server), not to the worker address: see
    // PrefillHandoffOptions::listen_host.
    if (options.listen_host.empty() || self->worker().peer_failure() != disagg::PeerFailure::kUcx) return Status();
    return self->listen(options.listen_host);
  });
  if (!s.is_ok()) return s;
  return p;
}

PrefillHandoff::~PrefillHandoff() { stop(); }

Result<uint64_t> PrefillHandoff::submit(GenerationRequest req, uint64_t room) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto c = cancelled_rooms_.find(room); c != cancelled_rooms_.end() && disagg::Clock::now() < c->second)
      return unavailable("hand-off: the decode instance cancelled room " + std::to_string(room) +
                         " before its request came here");
  }
  auto job = std::make_shared<Job>();
  job->room = room;
  req.handoff = Handoff::kSend;
  auto user = std::move(req.on_event);
  req.on_event = [this, job, user](const GenerationEvent& ev) {
    if (ev.finish == FinishReason::kNone && job->first.token < 0) job->first = ev;
    if (ev.finish != FinishReason::kNone) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        job->ended = true;
        if (job->id != 0) jobs_.erase(job->id);
        if (auto r = rooms_.find(job->room); r != rooms_.end() && r->second == job) rooms_.erase(r);
      }
      // Ended before parking (cancelled or failed while computing): the decode side's reservation is withdrawn.
      if (!job->parked) post([this, room = job->room] { withdraw_later(room); });
    }
    if (user) user(ev);
  };
  req.on_cache_location = [this, job](const CacheLocation& loc) {
    job->parked = true;
    job->loc = loc;
    {
      std::lock_guard<std::mutex> lk(mu_);
      counts_.in_flight++;
      counts_.started++;
    }
    job->parked_at = disagg::Clock::now();
    job->until = job->parked_at + opts_.destinations_timeout;
    post([this, job] {
      pending_.push_back(job);
      release_cancelled();
    });
  };
  {
    std::lock_guard<std::mutex> lk(mu_);
    rooms_[room] = job;
  }
  auto id = sched_.submit(std::move(req));
  bool cancel_now = false;  // the decode side's cancel came before the request had its id
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (id) {
      job->id = *id;
      if (!job->ended) jobs_[*id] = job;
      cancel_now = job->cancelled && !job->ended;
    } else if (auto r = rooms_.find(room); r != rooms_.end() && r->second == job) {
      rooms_.erase(r);
    }
  }
  // Refused here (queue full, prompt too long, shutting down): the decode side may have reserved memory for the
  // room already, and waits for it; its destinations are answered with a withdrawal, so it frees them and fails
  // its request now, not at its deadline.
  if (!id) post([this, room] { withdraw_later(room); });
  if (cancel_now) sched_.cancel(*id);
  return id;
}

// The flag first (a job not yet parked sees it when it parks), then the side's thread releases a parked job now.
void PrefillHandoff::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    it->second->cancelled = true;
  }
  post([this] { release_cancelled(); });
}

void PrefillHandoff::release_cancelled() {
  for (size_t i = 0; i < pending_.size();) {
    if (!pending_[i]->cancelled) {
      ++i;
      continue;
    }
    const std::shared_ptr<Job> job = pending_[i];
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    withdraw_later(job->room);
    finish(*job, Outcome::kCancelled, unavailable("hand-off: cancelled by the client"), 0);
  }
}

// The decode side may have reserved memory for this room (or may still): its destinations are answered with a
// withdrawal until the destinations deadline.
void PrefillHandoff::withdraw_later(uint64_t room) {
  ended_.push_back({room, disagg::Clock::now() + opts_.destinations_timeout});
}

// A decode side called a room off (its client cancelled, or its request ended): the request here is cancelled in
// the scheduler (while computing, or parked: it then ends kCancelled) and released at once if parked; a room not
// seen yet is refused when it comes. Destinations for the room are answered with a withdrawal either way.
void PrefillHandoff::take_cancels() {
  const auto now = disagg::Clock::now();
  while (std::optional<disagg::Message> m = worker().take(disagg::MessageKind::kCancel)) {
    const uint64_t room = m->header.transfer_id & ~(uint64_t{1} << 63);
    std::shared_ptr<Job> job;
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      counts_.cancel_messages++;
      if (auto it = rooms_.find(room); it != rooms_.end()) {
        job = it->second;
        job->cancelled = true;
        id = job->id;
      } else {
        cancelled_rooms_[room] = now + opts_.destinations_timeout;
      }
    }
    if (!job) {
      withdraw_later(room);
    } else if (id != 0 && !job->released) {
      sched_.cancel(id);  // before release_cancelled's release_parked: the request ends kCancelled
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::erase_if(cancelled_rooms_, [&](const auto& c) { return c.second <= now; });
  }
  release_cancelled();
}

PrefillCounts PrefillHandoff::counts() {
  std::lock_guard<std::mutex> lk(mu_);
  return counts_;
}

void PrefillHandoff::idle() {
  drop_failed_connections();
  take_cancels();
  notify_queued();
  for (size_t i = 0; i < ended_.size();) {
    std::optional<disagg::Message> m = worker().take(disagg::MessageKind::kDestinations, transfer_id(ended_[i].room));
    if (!m && disagg::Clock::now() < ended_[i].until) {
      ++i;
      continue;
    }
    if (m) {
      disagg::Endpoint* ep = endpoint(m->header.sender);
      if (ep != nullptr && !ep->failed() &&
          send_withdrawal(*ep, transfer_id(ended_[i].room), disagg::Deadline::after(opts_.transfer_timeout)).is_ok()) {
        std::lock_guard<std::mutex> lk(mu_);
        counts_.withdrawn++;
      }
    }
    ended_.erase(ended_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  for (size_t i = 0; i < pending_.size();) {
    Job& job = *pending_[i];
    std::optional<disagg::Message> m = worker().take(disagg::MessageKind::kDestinations, transfer_id(job.room));
    if (!m && disagg::Clock::now() < job.until) {
      ++i;
      continue;
    }
    const std::shared_ptr<Job> held = pending_[i];
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    Status st;
    uint64_t bytes = 0;
    bool cancelled = false;
    if (!m) {
      st = unavailable("hand-off: no destinations from a decode instance for room " + std::to_string(job.room) +
                       " within " + std::to_string(opts_.destinations_timeout.count()) + " ms");
    } else if (auto dst = disagg::decode_destinations(m->body); !dst) {
      st = dst.error();
    } else {
      st = transfer(job, m->header.sender, std::move(*dst), bytes, cancelled);
    }
    Outcome outcome = Outcome::kHandedOff;
    if (cancelled) {  // the transfer read the decode side's cancel itself
      outcome = Outcome::kCancelled;
      {
        std::lock_guard<std::mutex> lk(mu_);
        counts_.cancel_messages++;
      }
      sched_.cancel(job.id);  // the request ends kCancelled
    } else if (!m) {
      outcome = Outcome::kNoDestinations;
      withdraw_later(job.room);  // a decode reservation that comes late is freed at once, not at its deadline
    } else if (!st.is_ok()) {
      outcome = st.message().find("lease expired") != std::string::npos ? Outcome::kLeaseExpired
                                                                         : Outcome::kTransferFailed;
    }
    finish(job, outcome, st, bytes);
  }
}

// Unpacks (and caches on the endpoint: Endpoint::cached_rkey) the remote keys of destinations that have just
// arrived, while their sender has only just sent them. Over shared memory the unpack maps the decode's region
// into this process; once mapped it stays valid for as long as the key lives, whatever happens to the decode. An
// unpack after the decode had exited would fail in UCX, and UCX 1.13 crashes on that failure; so the transfer
// finds the key ready, or an unpack that failed (its error, not tried again). A decode that is already gone or
// being killed is not unpacked at all (Endpoint::peer_gone).
void PrefillHandoff::unpack_keys(const disagg::Message& m) {
  announced_.push_back({m.header.transfer_id & ~(uint64_t{1} << 63), m.header.sender,
                        disagg::Clock::now() + opts_.destinations_timeout});
  disagg::Endpoint* ep = endpoint(m.header.sender);
  if (ep == nullptr || ep->failed() || ep->closed()) return;  // the transfer fails without an unpack
  auto dst = disagg::decode_destinations(m.body);
  if (!dst) return;  // the transfer reports it
  for (const auto& packed : dst->rkeys) (void)ep->cached_rkey(packed);
}

// Every queued_interval: the decode side of each request whose destinations came and that is still queued or
// running here hears kQueued (its deadline is renewed). A parked or cancelled request's own transfer, withdrawal
// or release answers from then on; destinations for a room whose request has not come are not vouched for (a
// hang-up that never reached this side ends at the decode's deadline), and are forgotten at the destinations
// deadline.
void PrefillHandoff::notify_queued() {
  const auto now = disagg::Clock::now();
  if (announced_.empty() || now < next_queued_) return;
  next_queued_ = now + opts_.queued_interval;
  for (size_t i = 0; i < announced_.size();) {
    const Announced& a = announced_[i];
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (auto r = rooms_.find(a.room); r != rooms_.end()) job = r->second;
    }
    const bool done = job ? job->parked || job->cancelled : now >= a.until;
    if (done) {
      announced_.erase(announced_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    disagg::Endpoint* ep = endpoint(a.sender);
    if (job && ep != nullptr && !ep->failed())
      (void)disagg::send_queued(*ep, transfer_id(a.room), disagg::Deadline::after(std::chrono::milliseconds(100)));
    ++i;
  }
}

// A connection UCX reported failed (the peer's error, an endpoint timeout) carries nothing any more: it is closed
// and dropped at once, so its other end fails too (the decode side's transfers on it end now, not at their
// deadline, and its next hand-off connects again) instead of a live-looking connection that no hand-off can use.
void PrefillHandoff::drop_failed_connections() {
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    if (!it->second->failed()) {
      ++it;
      continue;
    }
    std::fprintf(stderr, "kestrel serve: prefill: connection to decode instance %llu given up: %s\n",
                 static_cast<unsigned long long>(it->first), it->second->failure().message().c_str());
    (void)it->second->close(disagg::Deadline::after(std::chrono::milliseconds(100)));
    it = endpoints_.erase(it);
  }
}

// Puts the request's state into the destinations, flushes, sends the completion (bounded by transfer_timeout).
Status PrefillHandoff::transfer(Job& job, uint64_t decode, disagg::Destinations dst, uint64_t& bytes,
                                bool& cancelled) {
  disagg::Endpoint* ep = endpoint(decode);
  if (ep == nullptr || ep->failed()) {
    return unavailable("hand-off: no open connection to decode instance " + std::to_string(decode) +
                       (ep == nullptr ? std::string(" (none)") : " (failed: " + ep->failure().message() + ")"));
  }
  if (ep->peer_gone()) {
    // Nothing to put into: the connection is given up (the next handshake from that address opens a new one).
    Status gone = unavailable("hand-off: decode instance " + std::to_string(decode) + " has exited");
    ep->mark_failed(gone);
    endpoints_.erase(decode);
    return gone;
  }
  std::array<std::byte, kRecordBytes> record{};
  Status st = encode_first_token(job.first, record);
  if (!st.is_ok()) return st;
  CachePools& pools = sched_.pools();
  const std::span<std::byte> arenas[] = {pools.slot_arena(), pools.mla_arena(), pools.index_arena(), record};
  std::vector<std::span<const std::byte>> sources;
  for (const PoolRange& r : handoff_layout(pools, job.loc)) {
    const bool zero = std::find(opts_.zeroed_parts.begin(), opts_.zeroed_parts.end(), r.part) != opts_.zeroed_parts.end();
    // The record is this request's own buffer here (the layout's offset is a slot's record on the decode side).
    const size_t offset = r.pool == Pool::kRecord ? 0 : r.offset;
    sources.push_back(zero ? std::span<const std::byte>(zeros_.data(), r.length)
                           : std::span<const std::byte>(arenas[static_cast<int>(r.pool)].subspan(offset, r.length)));
    bytes += r.length;
  }
  disagg::OutgoingTransfer out(transfer_id(job.room), *ep, std::move(dst), std::move(sources));
  st = out.run(disagg::Deadline::after(opts_.transfer_timeout), opts_.lease);
  cancelled = out.state() == disagg::TransferState::kCancelled;
  // A failed put closed the endpoint before returning (disagg/put.h): no put reads the pages now. The peer needs
  // a new connection.
  if (ep->failed() || ep->closed()) endpoints_.erase(decode);
  return st;
}

// Counted before the scheduler hears of it: a client that saw the request end sees the counts that go with it.
void PrefillHandoff::finish(Job& job, Outcome outcome, const Status& st, uint64_t bytes) {
  job.released = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    counts_.in_flight--;
    switch (outcome) {
      case Outcome::kHandedOff:
        counts_.handed_off++, counts_.bytes += bytes;
        counts_.seconds.observe(std::chrono::duration<double>(disagg::Clock::now() - job.parked_at).count());
        break;
      case Outcome::kNoDestinations: counts_.failed++, counts_.no_destinations++; break;
      case Outcome::kLeaseExpired: counts_.failed++, counts_.lease_expired++; break;
      case Outcome::kTransferFailed: counts_.failed++, counts_.transfer_failed++; break;
      case Outcome::kCancelled: counts_.cancelled++; break;
    }
  }
  if (outcome != Outcome::kHandedOff && outcome != Outcome::kCancelled) {
    std::fprintf(stderr, "kestrel serve: prefill: hand-off of request %llu failed after %.0f ms: %s\n",
                 static_cast<unsigned long long>(job.loc.request),
                 std::chrono::duration<double, std::milli>(disagg::Clock::now() - job.parked_at).count(),
                 st.message().c_str());
  }
  sched_.release_parked(job.loc.request, st.is_ok() ? "" : st.message());
}

}  // namespace kestrel::pd
