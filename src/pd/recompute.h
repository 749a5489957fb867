// What a decode instance does with a request whose hand-off failed, under `--handoff-failure recompute`: the
// request has not begun here (a hand-off fails only before the first token is admitted), so it runs on this
// instance from its prompt, as a colocated server runs it, and its client gets that answer instead of an error.
// Same engine, same kernels: the answer is the colocated one, bit for bit (greedy or seeded). Under the default,
// `fail`, the client gets the hand-off's error (and a router may retry elsewhere).
//
// The whole prompt is computed again: nothing received is reused, since a failed transfer's memory is
// quarantined and a hybrid model's KDA state cannot be resumed from part of a prompt.
//
// A failure arrives as the request's final kError event on the scheduler thread, which must not block; the
// resubmission runs on this object's own thread. A client's cancel that comes meanwhile ends the request as
// cancelled; one that comes after reaches the request run here.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>

#include "scheduler/scheduler.h"

namespace kestrel::pd {

enum class HandoffFailure { kFail, kRecompute };

struct RecomputeCounts {
  uint64_t recomputed = 0;  // requests run here after their hand-off failed (or could not start)
  uint64_t failed = 0;      // of those, the ones this scheduler refused too (the client got both reasons)
};

class Recompute {
 public:
  // The scheduler must outlive this object.
  explicit Recompute(Scheduler& scheduler);
  ~Recompute();  // requests still waiting to be resubmitted end with an error
  Recompute(const Recompute&) = delete;
  Recompute& operator=(const Recompute&) = delete;

  struct Ticket;
  // Before a hand-off request is submitted: its events now pass through here (a kError before its first token
  // starts the recompute instead of reaching the client). Keeps a copy of the request.
  std::shared_ptr<Ticket> watch(GenerationRequest& req);
  // After that submit returned the request's id (the id its client cancels by).
  void submitted(const std::shared_ptr<Ticket>& ticket, uint64_t id);
  // A request whose hand-off cannot even start (its prefill unreachable): submitted here as it is, at once.
  Result<uint64_t> run_here(GenerationRequest req, const Status& why);
  // A client's cancel of `id` (a hand-off request's id): reaches the request run here, or ends a resubmission
  // still to come. False when `id` is not one of those.
  bool cancel(uint64_t id);
  RecomputeCounts counts() const;

 private:
  struct State;  // shared with the events' callbacks, which may outlive this object
  void loop();
  void resubmit(const std::shared_ptr<Ticket>& t);

  Scheduler& sched_;
  std::shared_ptr<State> s_;
  std::thread thread_;
};

}  // namespace kestrel::pd
