// The peer process of pd_peer_test: loads the checkpoint, runs a scheduler with the tests' configuration and one
// side of the hand-off, and takes commands on stdin. Usage: pd_peer CHECKPOINT_DIR [MODE], MODE one of
//   (none)     prefill side
//   DELAY_MS   prefill side; every transfer's second range waits that long before it is posted (a slow transfer
//              to kill the process in)
//   stop       prefill side; every transfer stops this process (SIGSTOP) before its second range is posted: the
//              peer is frozen in the middle of the transfer, and goes on where it stopped after SIGCONT
//   decode     decode side (the test is the prefill side and freezes this process on cue)
//   decode-ucx decode side with its pools allocated through UCX, as `kestrel serve --role decode` allocates them
//              (over shared memory: System V segments, which the prefill maps by unpacking their keys)
// Prints "<instance> <pid> <address hex>" first. Commands:
//   connect INSTANCE ADDRESS_HEX        → opens the endpoint to the other side; prints "connected" (or "error ...")
//   run ROOM LENGTH SALT MAX_NEW        → prefill: hands off prompt(LENGTH, SALT); prints "done ROOM FINISH TOKENS"
//                                         at its final event
//   receive ROOM LENGTH SALT MAX_NEW PREFILL → decode: receives that request from the prefill instance; prints
//                                         "done ROOM FINISH TOKENS" at its final event
//   advertised                          → decode: "advertised N", the reservations whose destinations were sent
//   stats                               → "stats BLOCKS SLOTS IN_FLIGHT DONE FAILED X Y": the scheduler's pages and
//                                         slots held, the side's hand-offs in flight, completed, failed; prefill:
//                                         X = lease expiries, Y = 0; decode: X = quarantined, Y = registry ranges held
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "disagg/fault_policy.h"
#include "disagg/hex.h"
#include "pd/decode_handoff.h"
#include "pd/prefill_handoff.h"
#include "pd_util.h"

using namespace kestrel;

namespace {

std::mutex out_mu;

void say(const std::string& line) {
  std::lock_guard<std::mutex> lk(out_mu);
  std::cout << line << std::endl;
}

// Before the second range of every transfer: sleeps (a slow transfer) or stops this process (a frozen one).
class AtSecondPut : public disagg::FaultPolicy {
 public:
  AtSecondPut(std::chrono::milliseconds d, bool stop) : delay_(d), stop_(stop) {}
  disagg::PutFault on_put(uint64_t, size_t index, size_t) override {
    if (index != 1) return {};
    if (stop_) {
      raise(SIGSTOP);
      return {};
    }
    return {disagg::PutFault::Kind::kDelay, 0, delay_};
  }
  bool drop_message(uint16_t) override { return false; }
  bool stall_progress() override { return false; }

 private:
  std::chrono::milliseconds delay_;
  bool stop_;
};

GenerationRequest request(const std::vector<int32_t>& prompt, int max_new, uint64_t room) {
  GenerationRequest req;
  req.prompt = prompt;
  req.params.temperature = 0.0f;
  req.params.max_new_tokens = max_new;
  req.params.top_logprobs = 5;
  req.params.seed = 3, req.params.has_seed = true;
  auto tokens = std::make_shared<int>(0);
  req.on_event = [room, tokens](const GenerationEvent& ev) {
    if (ev.finish == FinishReason::kNone) ++*tokens;
    else say("done " + std::to_string(room) + " " + finish_reason_name(ev.finish) + " " + std::to_string(*tokens));
  };
  return req;
}

int fail(const std::string& what) {
  std::cerr << "pd_peer: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) return fail("usage: pd_peer CHECKPOINT_DIR [DELAY_MS|stop|decode|decode-ucx]");
  const std::string mode = argc == 3 ? argv[2] : "";
  const bool decoding = mode == "decode" || mode == "decode-ucx";
  auto engine = Engine::load(argv[1]);
  if (!engine) return fail(engine.error().message());
  SchedulerConfig config = pd::testing::config();
  pd::DecodeHandoffOptions decode_options;
  if (mode == "decode-ucx") {
    auto arenas = pd::DecodeArenas::create();
    if (!arenas) return fail(arenas.error().message());
    config.cache.arenas = decode_options.arenas = *arenas;
  }
  auto sched = Scheduler::create(**engine, config);
  if (!sched) return fail(sched.error().message());
  AtSecondPut faults(std::chrono::milliseconds(mode.empty() || mode == "stop" || decoding ? 0 : std::stoi(mode)),
                     mode == "stop");
  std::unique_ptr<pd::PrefillHandoff> prefill;
  std::unique_ptr<pd::DecodeHandoff> decode;
  pd::HandoffSide* side = nullptr;
  if (decoding) {
    auto d = pd::DecodeHandoff::create(**sched, decode_options);
    if (!d) return fail(d.error().message());
    decode = std::move(*d);
    side = decode.get();
  } else {
    pd::PrefillHandoffOptions options;
    if (!mode.empty()) options.worker.faults = &faults;
    auto p = pd::PrefillHandoff::create(**sched, options);
    if (!p) return fail(p.error().message());
    prefill = std::move(*p);
    side = prefill.get();
  }
  say(std::to_string(side->instance()) + " " + std::to_string(getpid()) + " " + disagg::testing::to_hex(side->address()));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "connect") {
      uint64_t instance = 0;
      std::string hex;
      in >> instance >> hex;
      Status s = side->connect(disagg::testing::from_hex(hex), instance);
      say(s.is_ok() ? "connected" : "error " + s.message());
    } else if (cmd == "run" && prefill) {
      uint64_t room = 0;
      int length = 0, salt = 0, max_new = 0;
      in >> room >> length >> salt >> max_new;
      if (!prefill->submit(request(pd::testing::prompt(length, salt), max_new, room), room)) {
        say("done " + std::to_string(room) + " rejected 0");
      }
    } else if (cmd == "receive" && decode) {
      uint64_t room = 0, from = 0;
      int length = 0, salt = 0, max_new = 0;
      in >> room >> length >> salt >> max_new >> from;
      if (!decode->submit(request(pd::testing::prompt(length, salt), max_new, room), room, from)) {
        say("done " + std::to_string(room) + " rejected 0");
      }
    } else if (cmd == "advertised" && decode) {
      say("advertised " + std::to_string(decode->counts().advertised));
    } else if (cmd == "stats") {
      const ServiceStats st = (*sched)->stats();
      std::string out = "stats " + std::to_string(st.kv_blocks_used) + " " + std::to_string(st.state_slots_used) + " ";
      if (prefill) {
        const pd::PrefillCounts c = prefill->counts();
        out += std::to_string(c.in_flight) + " " + std::to_string(c.handed_off) + " " + std::to_string(c.failed) +
               " " + std::to_string(c.lease_expired) + " 0";
      } else {
        const pd::DecodeCounts c = decode->counts();
        out += std::to_string(c.in_flight) + " " + std::to_string(c.received) + " " + std::to_string(c.failed) + " " +
               std::to_string(c.quarantined) + " " + std::to_string(c.registry.held_ranges);
      }
      say(out);
    } else {
      say("error unknown command: " + line);
    }
  }
  prefill.reset();
  decode.reset();
  return 0;
}
