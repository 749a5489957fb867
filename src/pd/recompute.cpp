#include "pd/recompute.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace kestrel::pd {

struct Recompute::Ticket {
  GenerationRequest req;  // the request as it runs here: no hand-off, no bootstrap
  std::function<void(const GenerationEvent&)> user;
  // Under State::mu:
  uint64_t id = 0;           // the hand-off request's id, once submitted
  uint64_t local = 0;        // the request run here, once resubmitted
  bool emitted = false;      // a token reached the client: a later error is no hand-off failure
  bool taken = false;        // its failure is taken over here
  bool ended = false;        // its final event reached the client
  bool cancelled = false;    // its client cancelled before the request ran here
  std::string reason;        // the hand-off's error
};

struct Recompute::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Ticket>> queue;
  std::unordered_map<uint64_t, std::shared_ptr<Ticket>> by_id;
  RecomputeCounts counts;
  bool stop = false;

  // Under mu: the ticket's request has ended for good (its client had the final event).
  void forget(Ticket& t) {
    t.ended = true;
    if (t.id != 0) by_id.erase(t.id);
  }
};

namespace {

GenerationEvent final_event(FinishReason finish, std::string error = {}) {
  GenerationEvent ev;
  ev.finish = finish;
  ev.error = std::move(error);
  return ev;
}

}  // namespace

Recompute::Recompute(Scheduler& scheduler) : sched_(scheduler), s_(std::make_shared<State>()) {
  thread_ = std::thread([this] { loop(); });
}

Recompute::~Recompute() {
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  thread_.join();
}

std::shared_ptr<Recompute::Ticket> Recompute::watch(GenerationRequest& req) {
  auto t = std::make_shared<Ticket>();
  t->req = req;
  t->req.id = 0;
  t->req.handoff = Handoff::kNone;
  t->req.bootstrap = {};
  t->req.on_cache_location = nullptr;
  t->req.on_event = nullptr;
  t->user = std::move(req.on_event);
  req.on_event = [s = s_, t](const GenerationEvent& ev) {
    {
      std::lock_guard<std::mutex> lk(s->mu);
      if (ev.finish == FinishReason::kError && !t->emitted && !t->taken && !s->stop) {
        t->taken = true;
        t->reason = ev.error;
        ++s->counts.recomputed;
        s->queue.push_back(t);
        s->cv.notify_all();
        return;
      }
      if (ev.token >= 0) t->emitted = true;
      if (ev.finish != FinishReason::kNone) s->forget(*t);
    }
    if (t->user) t->user(ev);
  };
  return t;
}

void Recompute::submitted(const std::shared_ptr<Ticket>& ticket, uint64_t id) {
  std::lock_guard<std::mutex> lk(s_->mu);
  ticket->id = id;
  if (!ticket->ended) s_->by_id[id] = ticket;
}

Result<uint64_t> Recompute::run_here(GenerationRequest req, const Status& why) {
  req.handoff = Handoff::kNone;
  req.bootstrap = {};
  req.on_cache_location = nullptr;
  Result<uint64_t> id = sched_.submit(std::move(req));
  std::lock_guard<std::mutex> lk(s_->mu);
  ++s_->counts.recomputed;
  if (!id) {
    ++s_->counts.failed;
    return Status(id.error().code(), "the hand-off could not start (" + why.message() +
                                         ") and this decode instance refused to run the request itself: " +
                                         id.error().message());
  }
  std::fprintf(stderr, "kestrel serve: decode: request %llu runs here from its prompt: the hand-off could not start (%s)\n",
               static_cast<unsigned long long>(*id), why.message().c_str());
  return id;
}

bool Recompute::cancel(uint64_t id) {
  uint64_t local = 0;
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    auto it = s_->by_id.find(id);
    if (it == s_->by_id.end()) return false;
    Ticket& t = *it->second;
    if (!t.taken) return false;  // still the hand-off request: cancelled where it is
    if (t.local == 0) {
      t.cancelled = true;  // the resubmission ends it as cancelled
      return true;
    }
    local = t.local;
  }
  sched_.cancel(local);
  return true;
}

RecomputeCounts Recompute::counts() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->counts;
}

void Recompute::loop() {
  for (;;) {
    std::shared_ptr<Ticket> t;
    {
      std::unique_lock<std::mutex> lk(s_->mu);
      s_->cv.wait(lk, [&] { return s_->stop || !s_->queue.empty(); });
      if (s_->queue.empty()) return;  // stopping, nothing left
      t = std::move(s_->queue.front());
      s_->queue.pop_front();
      if (s_->stop) {
        s_->forget(*t);
        lk.unlock();
        t->user(final_event(FinishReason::kError, t->reason + "; not run on this decode instance: it is stopping"));
        continue;
      }
    }
    resubmit(t);
  }
}

void Recompute::resubmit(const std::shared_ptr<Ticket>& t) {
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (t->cancelled) {
      s_->forget(*t);
      if (t->user) t->user(final_event(FinishReason::kCancelled));
      return;
    }
  }
  GenerationRequest r = t->req;
  r.on_event = [s = s_, t](const GenerationEvent& ev) {
    if (ev.finish != FinishReason::kNone) {
      std::lock_guard<std::mutex> lk(s->mu);
      s->forget(*t);
    }
    if (t->user) t->user(ev);
  };
  Result<uint64_t> id = sched_.submit(std::move(r));
  bool cancel_now = false;
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (!id) {
      ++s_->counts.failed;
      s_->forget(*t);
    } else {
      t->local = *id;
      cancel_now = t->cancelled;  // a cancel between the check above and now found no local id yet
    }
  }
  if (!id) {
    if (t->user)
      t->user(final_event(FinishReason::kError, t->reason + "; running it on this decode instance failed too: " +
                                                    id.error().message()));
    return;
  }
  std::fprintf(stderr, "kestrel serve: decode: request %llu runs here from its prompt as request %llu: %s\n",
               static_cast<unsigned long long>(t->id), static_cast<unsigned long long>(*id), t->reason.c_str());
  if (cancel_now) sched_.cancel(*id);
}

}  // namespace kestrel::pd
