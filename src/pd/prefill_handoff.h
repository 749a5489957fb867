// The prefill side of a hand-off. submit() runs a request on the scheduler with Handoff::kSend: the prompt is
// computed and the first token sampled as usual, then the sequence is parked; this side waits for the decode
// side's destinations for the request's room, puts the request's state (layout.h) and first-token record into
// them, flushes, sends the completion, and releases the parked sequence (its pages and slot are free only when
// no put can read them any more). The client sees the first token, then a final event: kLength when the state
// was handed over, kError with the reason otherwise.
//
// Every parked state is bounded: the wait for destinations by destinations_timeout, the transfer by
// transfer_timeout and by the decode side's lease (its heartbeats must keep coming); the pages are freed when
// either runs out.
//
// Cancellation: cancel() (after the scheduler's own cancel) releases a parked request at once. A request that
// ends without a hand-off (cancelled, failed) leaves its room here until the destinations deadline: destinations
// that arrive for it are answered with a withdrawal, so the decode side frees its reservation at once.
// The decode side's cancel (disagg kCancel for the room's transfer) cancels the request here too: in the
// scheduler while its prompt runs, released at once while parked, stopped between two puts during its transfer
// (the puts posted are flushed, then the decode side is told: completion status cancelled). A cancel for a room
// not submitted yet refuses its submit until the destinations deadline.
#pragma once

#include <chrono>
#include <memory>
#include <unordered_map>
#include <vector>

#include "pd/layout.h"
#include "pd/side.h"
#include "scheduler/metrics.h"
#include "scheduler/scheduler.h"

namespace kestrel::pd {

struct PrefillHandoffOptions {
  disagg::WorkerOptions worker;
  std::chrono::milliseconds destinations_timeout{10000};  // parked, waiting for the decode side's destinations
  std::chrono::milliseconds transfer_timeout{10000};      // puts + flush + completion
  // Lease on the parked pages during the transfer: the decode side renews it by every message (heartbeats every
  // 100 ms); one silent for longer (frozen, gone) loses it, and the pages are freed (disagg/put.h).
  std::chrono::milliseconds lease{2000};
  // While a request whose destinations came is still queued or running here (not parked yet), its decode side is
  // told so this often (disagg kQueued): each notice renews the decode's deadline, so a queue longer than the
  // hand-off deadline does not fail the request there. Shorter than the decode's transfer_timeout.
  std::chrono::milliseconds queued_interval{1000};
  // When set and the transports include tcp (disagg::PeerFailure::kUcx): decode instances connect to a UCX
  // listener on this IPv4 address (a free port, HandoffSide::listener_port) instead of this side connecting to
  // theirs by worker address. UCX then wires the tcp lanes endpoint to endpoint, whose teardown after a forced
  // close is safe while the link is down (docs/disaggregation.md, "Link down over tcp").
  std::string listen_host;
  // Tests only: these parts are sent as zeros (sizes and checksum stay consistent) to prove they matter.
  std::vector<Part> zeroed_parts;
};

struct PrefillCounts {
  uint64_t started = 0;  // parked after the first token
  uint64_t handed_off = 0, failed = 0, bytes = 0;
  // failed, by reason: no destinations in time (a room that then gets destinations is answered with a withdrawal),
  // the decode side's lease expired during the transfer, any other transfer failure
  uint64_t no_destinations = 0, lease_expired = 0, transfer_failed = 0;
  uint64_t cancelled = 0;        // parked or in transfer, released by a cancel (the client's or the decode side's)
  uint64_t cancel_messages = 0;  // cancels received from decode instances
  uint64_t withdrawn = 0;                             // decode reservations answered with a withdrawal
  size_t in_flight = 0;  // parked, not yet released
  Histogram seconds;     // parked → state handed over (completion sent), successful hand-offs
};

class PrefillHandoff final : public HandoffSide {
 public:
  // The scheduler must outlive this object.
  static Result<std::unique_ptr<PrefillHandoff>> create(Scheduler& scheduler, const PrefillHandoffOptions& options);
  ~PrefillHandoff() override;

  // `room` is the router's bootstrap room; the transfer id is derived from it (disagg: room | 1 << 63).
  Result<uint64_t> submit(GenerationRequest req, uint64_t room);
  // A client's cancel of a request submitted here (call after Scheduler::cancel).
  void cancel(uint64_t id);
  PrefillCounts counts();

 private:
  struct Job;
  struct Ended {
    uint64_t room;
    disagg::Clock::time_point until;
  };
  // Destinations that came for a room not parked yet: its decode side hears kQueued while the request is here.
  struct Announced {
    uint64_t room, sender;
    disagg::Clock::time_point until;  // for a room whose request has not come: forgotten then
  };
  enum class Outcome { kHandedOff, kNoDestinations, kLeaseExpired, kTransferFailed, kCancelled };
  PrefillHandoff(Scheduler& s, const PrefillHandoffOptions& o) : HandoffSide(o.worker), sched_(s), opts_(o) {}
  // On the side's thread: parked requests wait for their destinations (any order, each with its deadline).
  void idle() override;
  // `cancelled`: the decode side cancelled it during the transfer (stopped, flushed, told).
  Status transfer(Job& job, uint64_t decode, disagg::Destinations dst, uint64_t& bytes, bool& cancelled);
  void finish(Job& job, Outcome outcome, const Status& st, uint64_t bytes);
  void unpack_keys(const disagg::Message& m);  // side's thread: destinations as they arrive
  void release_cancelled();          // side's thread: cancelled parked jobs
  void withdraw_later(uint64_t room);  // side's thread
  void take_cancels();                 // side's thread: the decode sides' cancel messages
  void drop_failed_connections();      // side's thread: close and forget connections UCX reported failed
  void notify_queued();                // side's thread: kQueued to the decode sides of requests not parked yet

  Scheduler& sched_;
  PrefillHandoffOptions opts_;
  std::vector<std::byte> zeros_;
  std::vector<std::shared_ptr<Job>> pending_;  // side's thread only
  std::vector<Ended> ended_;                   // side's thread only
  std::vector<Announced> announced_;           // side's thread only
  disagg::Clock::time_point next_queued_{};    // side's thread only
  std::unordered_map<uint64_t, std::shared_ptr<Job>> jobs_;  // request id → job, until its final event (mu_)
  std::unordered_map<uint64_t, std::shared_ptr<Job>> rooms_;  // room → job, until its final event (mu_)
  // Rooms the decode side cancelled before their request came here, until then (mu_).
  std::unordered_map<uint64_t, disagg::Clock::time_point> cancelled_rooms_;
  std::mutex mu_;
  PrefillCounts counts_;
};

uint64_t transfer_id(uint64_t room);

}  // namespace kestrel::pd
