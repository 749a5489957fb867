#include "disagg/put.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "disagg/ucx_status.h"

namespace kestrel::disagg {
namespace {

Status fail(Endpoint& ep, Status reason) {
  ep.mark_failed(reason);
  (void)ep.close(Deadline::after(std::chrono::seconds(1)));
  return reason;
}

}  // namespace

Status put_and_flush(Endpoint& ep, uint64_t transfer_id, std::span<const PutRange> ranges, Deadline deadline,
                     std::chrono::milliseconds lease) {
  return put_and_flush(ep, transfer_id, ranges, Segments{{ranges.size()}, {}, {}, {}}, deadline, lease);
}

Status put_and_flush(Endpoint& ep, uint64_t transfer_id, std::span<const PutRange> ranges, const Segments& segments,
                     Deadline deadline, std::chrono::milliseconds lease) {
  if (ep.closed() || ep.failed()) return unavailable("disagg: put on a failed or closed endpoint");
  if (segments.ends.empty() || segments.ends.back() != ranges.size() ||
      !std::is_sorted(segments.ends.begin(), segments.ends.end())) {
    return invalid_argument("disagg: segment ends must ascend to the range count");
  }
  Worker& worker = ep.worker();
  const Clock::time_point started = Clock::now();
  // The peer renews the lease by any message; the call's start counts as one (a full lease to begin with).
  auto lease_expired = [&] {
    if (lease.count() <= 0 || !ep.peer()) return false;
    Clock::time_point since = started;
    if (auto heard = worker.last_heard(*ep.peer()); heard && *heard > since) since = *heard;
    return Clock::now() - since > lease;
  };
  auto lease_status = [&] {
    return unavailable("disagg: lease expired: peer silent for more than " + std::to_string(lease.count()) +
                       " ms during transfer " + std::to_string(transfer_id));
  };
  FaultPolicy* faults = worker.faults();
  std::vector<void*> requests;
  std::vector<std::vector<std::byte>> corrupted;  // private copies, alive until the flush completes
  // Posted flushes, one per segment, in segment order (null: completed at once); next_flushed: the first segment
  // whose flush has not been reported.
  std::vector<void*> flushes;
  size_t next_flushed = 0;
  auto pending = [&] {
    size_t n = 0;
    for (void*& r : requests) {
      if (r == nullptr) continue;
      ucs_status_t st = ucp_request_check_status(r);
      if (st == UCS_INPROGRESS) {
        ++n;
        continue;
      }
      ucp_request_free(r);
      r = nullptr;
      if (st != UCS_OK) ep.mark_failed(ucx_error(st, "ucp_put_nbx"));
    }
    return n;
  };
  // Reports the segments whose flushes have completed, in order; a failed flush or report fails the endpoint.
  auto reap_flushes = [&] {
    while (next_flushed < flushes.size() && !ep.failed()) {
      void*& f = flushes[next_flushed];
      if (f != nullptr) {
        ucs_status_t st = ucp_request_check_status(f);
        if (st == UCS_INPROGRESS) return;
        ucp_request_free(f);
        f = nullptr;
        if (st != UCS_OK) {
          ep.mark_failed(ucx_error(st, "ucp_ep_flush_nbx"));
          return;
        }
      }
      if (segments.flushed) {
        Status reported = segments.flushed(next_flushed);
        if (!reported.is_ok()) {
          ep.mark_failed(reported);
          return;
        }
      }
      ++next_flushed;
    }
  };
  // Marks the endpoint failed and closes it (kUcx: forced, every request completes, cancelled), then releases the
  // requests. A close still in progress (kHeartbeat) may leave a put reading a corrupted copy: the worker keeps it.
  auto abort_with = [&](Status reason) {
    fail(ep, reason);
    for (void* r : requests) {
      if (r != nullptr) ucp_request_free(r);
    }
    for (void* f : flushes) {
      if (f != nullptr) ucp_request_free(f);
    }
    if (!ep.closed()) {
      for (auto& c : corrupted) worker.keep_until_destroyed(std::move(c));
    }
    return reason;
  };

  // Stopped: one more flush covers every put posted so far; it and the segments' flushes complete unreported.
  auto flush_stopped = [&] {
    ucp_request_param_t param{};
    void* last = ucp_ep_flush_nbx(ep.handle(), &param);
    if (UCS_PTR_IS_ERR(last)) return abort_with(ucx_error(UCS_PTR_STATUS(last), "ucp_ep_flush_nbx"));
    flushes.push_back(last);
    auto outstanding = [&] {
      size_t n = pending();
      for (void*& f : flushes) {
        if (f == nullptr) continue;
        ucs_status_t st = ucp_request_check_status(f);
        if (st == UCS_INPROGRESS) {
          ++n;
          continue;
        }
        ucp_request_free(f);
        f = nullptr;
        if (st != UCS_OK) ep.mark_failed(ucx_error(st, "ucp_ep_flush_nbx"));
      }
      return n;
    };
    bool expired = false;
    Status waited = worker.wait([&] { return outstanding() == 0 || ep.failed() || (expired = lease_expired()); },
                                deadline, "flushing the puts posted before a stop");
    if (!waited.is_ok()) return abort_with(waited);
    if (expired) return abort_with(lease_status());
    if (ep.failed()) return abort_with(ep.failure());
    return Status::ok();
  };

  size_t segment = 0;
  for (size_t i = 0; i <= ranges.size(); ++i) {
    // Segments that end here (an empty one included): posted, then their flush.
    while (segment < segments.ends.size() && segments.ends[segment] == i) {
      if (segments.posted) {
        Status st = segments.posted(segment);
        if (!st.is_ok()) return abort_with(st);
      }
      ucp_request_param_t param{};
      void* flush = ucp_ep_flush_nbx(ep.handle(), &param);
      if (UCS_PTR_IS_ERR(flush)) return abort_with(ucx_error(UCS_PTR_STATUS(flush), "ucp_ep_flush_nbx"));
      flushes.push_back(flush);
      ++segment;
      reap_flushes();
      if (ep.failed()) return abort_with(ep.failure());
    }
    if (i == ranges.size()) break;
    // The open segment (index `segment`) and the posted ones whose flush has not been reported: at most window.
    if (segments.window > 0 && segment - next_flushed >= segments.window) {
      bool expired = false;
      Status waited = worker.wait(
          [&] {
            reap_flushes();
            return segment - next_flushed < segments.window || ep.failed() || (expired = lease_expired()) ||
                   (segments.stop && segments.stop());
          },
          deadline, "waiting for a segment's flush");
      if (!waited.is_ok()) return abort_with(waited);
      if (expired) return abort_with(lease_status());
      if (ep.failed()) return abort_with(ep.failure());
    }
    const PutRange& r = ranges[i];
    if (r.rkey == nullptr || r.rkey->handle() == nullptr) {
      return abort_with(invalid_argument("disagg: put without rkey"));
    }
    const std::byte* source = r.source;
    if (faults != nullptr) {
      PutFault f = faults->on_put(transfer_id, i, r.length);
      if (f.kind == PutFault::Kind::kDrop) continue;
      if (f.kind == PutFault::Kind::kDelay) {
        std::this_thread::sleep_for(f.delay);
        // What arrived meanwhile (the peer's heartbeats among it) is read before the lease is judged.
        for (int round = 0; round < 16 && worker.progress(); ++round) {
        }
      }
      if (f.kind == PutFault::Kind::kCorrupt && f.byte < r.length) {
        corrupted.emplace_back(r.source, r.source + r.length);
        corrupted.back()[f.byte] = ~corrupted.back()[f.byte];
        source = corrupted.back().data();
      }
    }
    if (segments.stop && segments.stop()) return flush_stopped();
    if (deadline.expired()) return abort_with(unavailable("disagg: posting puts: deadline passed"));
    ucp_request_param_t param{};
    void* request = ucp_put_nbx(ep.handle(), source, r.length, r.remote, r.rkey->handle(), &param);
    if (UCS_PTR_IS_ERR(request)) return abort_with(ucx_error(UCS_PTR_STATUS(request), "ucp_put_nbx"));
    if (request != nullptr) requests.push_back(request);
    worker.progress();
    (void)pending();
    reap_flushes();
    if (ep.failed()) return abort_with(ep.failure());
    if (lease_expired()) return abort_with(lease_status());
  }
  bool expired = false;
  Status waited = worker.wait(
      [&] {
        reap_flushes();
        return (next_flushed == flushes.size() && pending() == 0) || ep.failed() || (expired = lease_expired());
      },
      deadline, "flushing puts");
  if (!waited.is_ok()) return abort_with(waited);
  if (expired) return abort_with(lease_status());
  if (ep.failed()) return abort_with(ep.failure());
  return Status::ok();
}

}  // namespace kestrel::disagg
