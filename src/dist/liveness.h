// Liveness: a cell's heartbeats on plain TCP, independent of the MPI collectives (docs/cell.md, §5).
//
// Open MPI 4.1 has no fault tolerance: a rank that blocks in a collective waits there until mpirun ends it, and
// a frozen peer (SIGSTOP, a stalled host) is never noticed at all. So every rank also keeps one TCP connection
// in a star around rank 0 (address and a per-cell nonce exchanged once, at startup, by an MPI broadcast), and a
// thread on each rank sends one byte every window/5 and watches what arrives:
//
//   - rank 0 watches every other rank: a connection that closes (the kernel closes a dead process's sockets)
//     makes the cell unhealthy at once; a rank silent for `window` makes it unhealthy until it is heard again;
//   - every other rank watches rank 0;
//   - a peer silent (or gone) for `deadline` fires the deadline event: the caller ends its process non-zero, and
//     mpirun then ends the rest of the cell. This bounds a cell with a frozen rank, whose collectives would
//     otherwise wait forever.
//
// LivenessTracker is the decision logic with time passed in (unit-tested without sockets or clocks); Liveness
// runs it on its own thread. Neither calls MPI after open(); the thread never blocks on a peer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "dist/communicator.h"

namespace kestrel::dist {

struct LivenessOptions {
  std::chrono::milliseconds window{1000};    // a peer silent this long makes the cell unhealthy
  std::chrono::milliseconds deadline{5000};  // a peer silent or gone this long ends the cell (≥ window)
  std::chrono::milliseconds connect_timeout{60000};  // startup: rank 0 waits this long for every peer's hello
};

// Heartbeat period: five per window, so one late or lost beat never trips the window.
std::chrono::milliseconds heartbeat_period(const LivenessOptions& o);

class LivenessTracker {
 public:
  using Clock = std::chrono::steady_clock;
  struct Verdict {
    bool healthy = true;
    int rank = -1;             // the peer that made it unhealthy (the longest silent; lowest rank on a tie)
    std::string why;           // "rank 1 sent no heartbeat for 1200 ms", "rank 1 closed its liveness connection ..."
    bool deadline_passed = false;
  };
  // `peers`: the ranks watched, each counted as heard at `now`.
  LivenessTracker(std::vector<int> peers, LivenessOptions o, Clock::time_point now);
  void heard(int rank, Clock::time_point now);
  // The peer's connection closed: unhealthy at once and for good; its deadline counts from when it was last heard.
  void lost(int rank, Clock::time_point now);
  Verdict check(Clock::time_point now) const;
  // The earliest time after `now` at which check() can change without a new event (a peer's window or deadline
  // running out); Clock::time_point::max() when none can.
  Clock::time_point next_change(Clock::time_point now) const;

 private:
  struct Peer {
    int rank;
    Clock::time_point last;
    bool lost = false;
  };
  Peer* find(int rank);
  std::vector<Peer> peers_;
  LivenessOptions o_;
};

class Liveness {
 public:
  // What the thread reports, each on a change: unhealthy (with the verdict's `why`), healthy again, and the
  // deadline (once). Called on the liveness thread; they must not block for long.
  struct Events {
    std::function<void(const std::string&)> unhealthy, healthy, deadline;
  };

  // Collective over `comm` (every rank calls it once): rank 0 listens on all IPv4 interfaces on a port the kernel
  // picks and broadcasts its host name, port and a random nonce; every other rank connects (to 127.0.0.1 when
  // the host name is its own) and says hello (its rank and the nonce); rank 0 accepts one hello per rank within
  // connect_timeout and drops strangers. Heartbeats start with start().
  static Result<std::unique_ptr<Liveness>> open(Communicator& comm, LivenessOptions o);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  void start(Events events);
  // Empty while every watched peer is alive; else why not (thread-safe).
  std::string unhealthy() const;
  // The process is about to stop on purpose (its peers will close their connections): keep sending heartbeats,
  // report nothing more.
  void expect_exit() { quiet_ = true; }

 private:
  Liveness(int rank, int size, LivenessOptions o) : rank_(rank), size_(size), o_(o) {}
  Status listen_on_any(uint16_t& port);
  Status accept_peers(uint64_t nonce);
  Status connect_to(const std::string& host, uint16_t port, uint64_t nonce);
  void loop(Events events);

  int rank_, size_;
  LivenessOptions o_;
  int listen_fd_ = -1;
  std::vector<int> fds_;    // per watched peer: rank 0 → ranks 1..P-1, others → rank 0
  std::vector<int> ranks_;  // the peer rank of each fds_ entry
  std::thread thread_;
  std::atomic<bool> stop_{false}, quiet_{false};
  mutable std::mutex mu_;
  std::string why_;  // guarded by mu_
};

}  // namespace kestrel::dist
