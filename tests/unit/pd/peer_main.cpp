// The prefill side of pd_peer_test as its own process: loads the checkpoint, runs a scheduler and a
// PrefillHandoff with the tests' configuration, and takes commands on stdin:
//   connect INSTANCE ADDRESS_HEX        → opens the endpoint to the decode side; prints "connected" (or "error ...")
//   run ROOM LENGTH SALT MAX_NEW        → hands off prompt(LENGTH, SALT); prints "done ROOM FINISH" at its final event
// Usage: pd_peer CHECKPOINT_DIR [PUT_DELAY_MS]. Prints "<instance> <pid> <address hex>" first. With a put delay,
// every transfer's second range waits that long before it is posted (a slow transfer to kill the process in).
#include <unistd.h>

#include <iostream>
#include <mutex>
#include <sstream>
#include <string>

#include "disagg/fault_policy.h"
#include "disagg/hex.h"
#include "pd/prefill_handoff.h"
#include "pd_util.h"

using namespace kestrel;

namespace {

std::mutex out_mu;

void say(const std::string& line) {
  std::lock_guard<std::mutex> lk(out_mu);
  std::cout << line << std::endl;
}

class DelaySecondPut : public disagg::FaultPolicy {
 public:
  explicit DelaySecondPut(std::chrono::milliseconds d) : delay_(d) {}
  disagg::PutFault on_put(uint64_t, size_t index, size_t) override {
    if (index != 1) return {};
    return {disagg::PutFault::Kind::kDelay, 0, delay_};
  }
  bool drop_message(uint16_t) override { return false; }
  bool stall_progress() override { return false; }

 private:
  std::chrono::milliseconds delay_;
};

int fail(const std::string& what) {
  std::cerr << "pd_peer: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) return fail("usage: pd_peer CHECKPOINT_DIR [PUT_DELAY_MS]");
  auto engine = Engine::load(argv[1]);
  if (!engine) return fail(engine.error().message());
  auto sched = Scheduler::create(**engine, pd::testing::config());
  if (!sched) return fail(sched.error().message());
  DelaySecondPut delay(std::chrono::milliseconds(argc == 3 ? std::stoi(argv[2]) : 0));
  pd::PrefillHandoffOptions options;
  if (argc == 3) options.worker.faults = &delay;
  auto side = pd::PrefillHandoff::create(**sched, options);
  if (!side) return fail(side.error().message());
  say(std::to_string((*side)->instance()) + " " + std::to_string(getpid()) + " " +
      disagg::testing::to_hex((*side)->address()));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "connect") {
      uint64_t instance = 0;
      std::string hex;
      in >> instance >> hex;
      Status s = (*side)->connect(disagg::testing::from_hex(hex), instance);
      say(s.is_ok() ? "connected" : "error " + s.message());
    } else if (cmd == "run") {
      uint64_t room = 0;
      int length = 0, salt = 0, max_new = 0;
      in >> room >> length >> salt >> max_new;
      GenerationRequest req;
      req.prompt = pd::testing::prompt(length, salt);
      req.params.temperature = 0.0f;
      req.params.max_new_tokens = max_new;
      req.params.top_logprobs = 5;
      req.params.seed = 3, req.params.has_seed = true;
      req.on_event = [room](const GenerationEvent& ev) {
        if (ev.finish != FinishReason::kNone) say("done " + std::to_string(room) + " " + finish_reason_name(ev.finish));
      };
      auto id = (*side)->submit(std::move(req), room);
      if (!id) say("done " + std::to_string(room) + " rejected");
    }
  }
  side->reset();
  return 0;
}
