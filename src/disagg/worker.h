// Worker: a UCP worker (UCX's progress engine) on its Context, the inbox of control messages it received, and the
// heartbeats it owes its endpoints. The context is its own unless WorkerOptions::context shares one (memory
// allocated through it before the worker exists). UCS_THREAD_MODE_SINGLE: a Worker and everything created from it (endpoints,
// regions, listeners, transfers) are used by one thread, the one that calls progress(). Transports come from the
// environment (UCX_TLS: shared memory on one host, tcp across hosts) unless WorkerOptions::transports names them.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "disagg/context.h"
#include "disagg/deadline.h"
#include "disagg/fault_policy.h"
#include "disagg/messages.h"

namespace kestrel::disagg {

class Endpoint;

// How a dead peer is noticed. UCX's own peer failure detection (UCP_ERR_HANDLING_MODE_PEER: the endpoint's error
// handler runs when the peer dies or the connection breaks) needs transports that support it; in UCX 1.13 the
// shared-memory transports (posix, sysv, cma) do not ("no peer failure handler"), and endpoints that ask for it
// get no usable lanes. There the heartbeats are the only detector (UCP_ERR_HANDLING_MODE_NONE).
enum class PeerFailure {
  kAuto,       // kUcx unless every transport named (options or UCX_TLS) is a shared-memory one
  kUcx,        // UCP_ERR_HANDLING_MODE_PEER, plus heartbeats
  kHeartbeat,  // UCP_ERR_HANDLING_MODE_NONE: heartbeats only
};

struct WorkerOptions {
  std::string transports;       // UCX TLS list for this context (UCX_TLS syntax); empty: UCX_TLS from the environment
  std::shared_ptr<Context> context;  // a context to share (its transports apply; `transports` is then unused)
  PeerFailure peer_failure = PeerFailure::kAuto;
  uint64_t instance = 0;        // this worker's id on the wire; 0: drawn at random
  std::chrono::milliseconds heartbeat_interval{100};  // to every live endpoint; 0 disables
  std::chrono::milliseconds message_ttl{60000};  // unread control messages older than this are dropped
  FaultPolicy* faults = nullptr;  // tests only
};

struct Message {
  MessageHeader header;
  std::vector<std::byte> body;
  Clock::time_point arrived;
};

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> create(const WorkerOptions& options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  uint64_t instance() const { return options_.instance; }
  ucp_context_h context() const { return context_->handle(); }
  const std::shared_ptr<Context>& shared_context() const { return context_; }
  ucp_worker_h handle() const { return worker_; }
  FaultPolicy* faults() const { return options_.faults; }
  // kUcx or kHeartbeat (kAuto resolved at creation).
  PeerFailure peer_failure() const { return options_.peer_failure; }

  // This worker's packed UCX address (for a peer's Endpoint::connect_address).
  Result<std::vector<std::byte>> address() const;

  // One round of UCX progress (skipped while the fault policy stalls it), then the heartbeats that are due.
  // Returns whether UCX reported any event.
  bool progress();
  // Progresses until done() is true (Ok) or the deadline passes (kUnavailable naming `what`). idle() between
  // rounds without events.
  Status wait(const std::function<bool()>& done, Deadline deadline, std::string_view what);
  // The pause between two progress rounds without events: while UCX reported an event within the last
  // kBusyWindow (a transfer in progress: its segment announcements come every few hundred µs, and over shared
  // memory the puts themselves raise no event here) only a yield of the core, so that a message is read as soon as
  // it lands; otherwise a sleep of `sleep` (an idle worker costs next to nothing).
  void idle(std::chrono::microseconds sleep = std::chrono::microseconds(100));
  static constexpr std::chrono::milliseconds kBusyWindow{2};

  // Takes the oldest received message of this kind for this transfer (any transfer when transfer_id is 0) from
  // this sender (any sender when nullopt). Transfer ids are never 0.
  std::optional<Message> take(MessageKind kind, uint64_t transfer_id = 0, std::optional<uint64_t> sender = {});
  // Runs `hook` on the side's thread for every message of `kind` as soon as progress() has received it (right
  // after the round of UCX progress that read it, before any take() can return it), while the sender has only
  // just sent it: for work that must not wait until the message is taken, such as unpacking a peer's remote keys
  // while its process still exists (Endpoint::cached_rkey). One hook per kind; an empty one removes it.
  void on_arrival(MessageKind kind, std::function<void(const Message&)> hook);
  // Discards the queued messages of a transfer (one that has ended: late or stale messages are never read), and
  // for message_ttl drops its segment announcements, queued notices and completion on arrival (a sender's that
  // come after the receiving side gave up), counted as expired; reopen() ends that for a new transfer with the
  // same id.
  void discard(uint64_t transfer_id);
  void reopen(uint64_t transfer_id) { ended_.erase(transfer_id); }
  // When a message (heartbeats included) last arrived from this instance; nullopt if never.
  std::optional<Clock::time_point> last_heard(uint64_t instance) const;
  // The pid this instance's messages carry; nullopt if none arrived.
  std::optional<uint32_t> pid_of(uint64_t instance) const;
  size_t malformed_messages() const { return malformed_; }
  size_t queued_messages() const { return inbox_.size(); }
  // Messages dropped unread: the inbox was full (kMaxQueued), or they outlived message_ttl (destinations for a
  // request this instance never got, a completion that came after its transfer gave up or ended).
  size_t overflowed_messages() const { return overflowed_; }
  size_t expired_messages() const { return expired_; }
  static constexpr size_t kMaxQueued = 65536;

  // Buffers that an endpoint destroyed while still closing leaves to UCX requests, freed after ucp_worker_destroy.
  void keep_until_destroyed(std::vector<std::byte> bytes) { orphans_.push_back(std::move(bytes)); }

  // Endpoints register themselves for heartbeats while open.
  void add_heartbeat(Endpoint* ep);
  void remove_heartbeat(Endpoint* ep);

 private:
  explicit Worker(const WorkerOptions& options) : options_(options) {}
  static ucs_status_t on_message(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param);
  void send_due_heartbeats();

  WorkerOptions options_;
  std::shared_ptr<Context> context_;
  ucp_worker_h worker_ = nullptr;
  std::deque<Message> inbox_;
  struct Heard {
    Clock::time_point at;
    uint32_t pid = 0;
  };
  std::unordered_map<uint64_t, Heard> heard_;
  size_t malformed_ = 0;
  size_t overflowed_ = 0;
  size_t expired_ = 0;
  std::unordered_map<uint64_t, Clock::time_point> ended_;  // discarded transfers → when
  std::vector<Endpoint*> heartbeats_;
  std::unordered_map<uint16_t, std::function<void(const Message&)>> arrival_hooks_;
  std::vector<Message> arrived_;  // received in this round of progress, for arrival_hooks_
  std::vector<std::vector<std::byte>> orphans_;
  Clock::time_point next_heartbeat_{};
  Clock::time_point last_event_{};
};

}  // namespace kestrel::disagg
