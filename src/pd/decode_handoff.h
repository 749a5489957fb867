// The decode side of a hand-off. The scheduler's pools (KDA slots, MLA pages, DSA indexer pages) and a record
// arena (one first-token record per slot) are registered with UCX once, at creation: when the pools were
// allocated by DecodeHandoffOptions::arenas (the server's decode role), their UCX regions are advertised as they
// are and the record arena is allocated there too, so that a prefill on the same host puts into them directly;
// otherwise the pools' heap memory is registered (puts over shared memory are then emulated, pd/decode_arenas.h). submit() queues a request
// with Handoff::kReceive: admission reserves a slot and the prompt's pages; this side sends their addresses for
// the request's room to the prefill instance, waits for the completion, verifies sizes and checksum over the
// received bytes, and only then admits the request into the decode batch with the first token from its record.
//
// When the prefill's request ends before its hand-off (cancelled by its client, failed), the prefill withdraws it
// and the reserved memory returns at once; the client gets kCancelled (cancelled here too) or kError.
//
// The other way round, cancel() (after the scheduler's own cancel) tells the prefill to stop (disagg kCancel):
// before the reservation is advertised nothing is advertised and the memory returns at once; once advertised the
// memory stays leased until the prefill confirms it no longer writes (completion status cancelled or withdrawn,
// or a completion it had already sent), else it fails and is quarantined as below. A request that ends here
// before its reservation (cancelled or failed while waiting for admission) calls the room off the same way.
//
// On failure (deadline, silent or dead peer, checksum mismatch, the prefill gave up) the client gets a kError
// event at once. The reserved memory stays quarantined while the peer may still write into it: the connection to
// that peer is closed, and the memory returns to the pools when the registry says the peer can no longer write
// (tcp: at the close; shared memory: once the peer's process has exited too). A new connect() is needed for the
// peer after that.
#pragma once

#include <chrono>
#include <memory>
#include <unordered_map>

#include "disagg/region_registry.h"
#include "pd/decode_arenas.h"
#include "disagg/transfer.h"
#include "pd/layout.h"
#include "pd/side.h"
#include "scheduler/metrics.h"
#include "scheduler/scheduler.h"

namespace kestrel::pd {

struct DecodeHandoffOptions {
  disagg::WorkerOptions worker;  // its context is the arenas' when `arenas` is set
  // Where the scheduler's pools were allocated (the same object as its CachePoolConfig::arenas), or null.
  std::shared_ptr<DecodeArenas> arenas;
  std::chrono::milliseconds transfer_timeout{10000};  // destinations sent → completion verified
  std::chrono::milliseconds silence{2000};            // no message (heartbeats included) from the prefill
};

struct DecodeCounts {
  uint64_t started = 0;     // reservations made for a prefill (their destinations go out next)
  uint64_t advertised = 0;  // of those, the ones whose destinations were sent (locally complete)
  uint64_t received = 0, failed = 0, bytes = 0;
  // failed, by reason: checksum or size mismatch, deadline, the prefill gave up after its puts began, the peer
  // failed or fell silent (or no connection)
  uint64_t failed_corrupt = 0, failed_deadline = 0, failed_sender = 0, failed_peer = 0;
  uint64_t withdrawn = 0;  // the prefill's request ended before any put: memory freed at once, not quarantined
  // Hand-offs this side called off (kCancel sent: its client cancelled, or its request ended first), and of those
  // in transfer, the ones the prefill confirmed stopped (status cancelled: memory freed at once)
  uint64_t cancelled = 0, cancel_confirmed = 0;
  size_t in_flight = 0;    // reserved, transfer not ended
  size_t quarantined = 0;  // failed, memory not yet returned
  uint64_t quarantined_bytes = 0;
  Histogram seconds;  // destinations sent → completion verified, successful hand-offs
  disagg::RegistryCounts registry;
};

class DecodeHandoff final : public HandoffSide {
 public:
  // The scheduler must outlive this object.
  static Result<std::unique_ptr<DecodeHandoff>> create(Scheduler& scheduler, const DecodeHandoffOptions& options);
  ~DecodeHandoff() override;

  // `prefill` is the instance id of the (connected) prefill side that holds the request of `room`.
  Result<uint64_t> submit(GenerationRequest req, uint64_t room, uint64_t prefill);
  // A client's cancel of a request submitted here (call after Scheduler::cancel).
  void cancel(uint64_t id);
  // A draining server, once its scheduler has stopped (Scheduler::drain): every hand-off still under way (an
  // advertised transfer not ended, a request that never got its reservation) is called off with kCancel (reason:
  // ended), so that its prefill releases the request now, not at its own deadlines or at this side's silence;
  // each message waits at most `bound` for the transport.
  void abandon(std::chrono::milliseconds bound = std::chrono::milliseconds(1000));
  DecodeCounts counts();
  // Whether the endpoint to this prefill instance is open (false after a failure gave it up).
  bool connected(uint64_t prefill);

 private:
  struct Quarantined {
    uint64_t request;
    disagg::Endpoint* ep;  // the endpoint it was advertised through (in retired_); null: nothing advertised
    uint64_t bytes;
  };
  // One request submitted here, until its final event (fields under mu_).
  struct Entry {
    uint64_t room = 0, prefill = 0, id = 0;
    bool located = false;   // reserved: its hand-off starts (or started) on the side's thread
    bool cancelled = false;  // cancel() came
    bool ended = false;
    bool called_off = false;  // kCancel sent for a request never reserved (on_event or abandon)
  };
  DecodeHandoff(Scheduler& s, const DecodeHandoffOptions& o) : HandoffSide(worker_options(o)), sched_(s), opts_(o) {}
  static disagg::WorkerOptions worker_options(const DecodeHandoffOptions& o);
  Status register_pools();
  struct Pending {
    CacheLocation loc;
    disagg::Endpoint* ep;
    uint64_t bytes;
    std::unique_ptr<disagg::IncomingTransfer> transfer;
    disagg::Clock::time_point since, until;
  };
  // On the side's thread: start() advertises a reservation; idle() polls every transfer (any order).
  void start_transfer(const Entry& e, const CacheLocation& loc);
  // Side's thread: kCancel to the request's prefill (in transfer: through its IncomingTransfer).
  void call_off(const Entry& e, disagg::CancelReason reason, std::chrono::milliseconds bound);
  void end(const CacheLocation& loc, disagg::Endpoint* ep, Status st, uint64_t bytes,
           disagg::Clock::time_point since = {});
  // The prefill withdrew (it never put) or confirmed a cancel (it stopped): the memory is free at once.
  void withdraw(const CacheLocation& loc, const Status& st, bool cancel_confirmed);
  void idle() override;
  void teardown() override;
  void retire(std::unique_ptr<disagg::Endpoint> ep) override;

  Scheduler& sched_;
  DecodeHandoffOptions opts_;
  std::shared_ptr<std::byte> records_;
  // Registered regions by Pool (null for an empty pool).
  std::shared_ptr<disagg::Region> regions_[4];
  disagg::RegionRegistry registry_;
  std::vector<Pending> pending_;
  std::vector<Quarantined> quarantined_;
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> requests_;  // request id → entry, until its final event (mu_)
  // Endpoints given up after a failure: closed, kept while a quarantined or pending transfer refers to them.
  std::vector<std::unique_ptr<disagg::Endpoint>> retired_;
  std::mutex mu_;
  DecodeCounts counts_;
};

}  // namespace kestrel::pd
