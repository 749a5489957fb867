// The hand-off between two processes: this test is the decode side (scheduler + DecodeHandoff on its own engine),
// pd_peer (a child process) the prefill side, both loading the same tiny K3 checkpoint, connected over the
// transports UCX_TLS selects (ctest: shm and tcp), the lanes checked. This side's pools are allocated as a decode
// server's are (DecodeArenas: through UCX).
//   - Parity: decoding after the hand-off equals a colocated run in this process bit for bit.
//   - A prefill killed (SIGKILL) in the middle of a transfer fails the request with a clear error, without a hang;
//     once the dead peer can no longer write (tcp: connection closed; shared memory: also its process reaped)
//     every reserved page and slot is back and no transfer is held.
//   - A prefill frozen (SIGSTOP) in the middle of a transfer, past the silence limit: the decode side fails the
//     request with a clear error and gives the connection up; the reserved memory stays quarantined for as long
//     as the peer may write into it (tcp: until the endpoint is closed; shared memory: until the peer's process
//     is gone). After SIGCONT the prefill's late writes land only there (a new hand-off meanwhile is exact),
//     nothing is decoded from them, and both sides return to baseline.
//   - A decode side (pd_peer decode, whose heap pools are registered: over shared memory UCX emulates the puts
//     into them, so the flush needs the decode's progress, as over tcp) frozen in the middle of a transfer, past
//     the prefill's lease: the prefill (this process) frees the pages and counts a lease expiry while the decode
//     is still stopped; after SIGCONT the decode's request fails cleanly, nothing is in flight, and its memory is
//     back (tcp) or quarantined while the writer, this process, lives (shared memory).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "common/test_util.h"
#include "disagg/child.h"
#include "disagg/hex.h"
#include "disagg/pair.h"
#include "pd/decode_handoff.h"
#include "pd/prefill_handoff.h"
#include "pd_util.h"

namespace kestrel::pd {
namespace {

using namespace std::chrono_literals;
using disagg::testing::Child;
using kestrel::testing::Client;
using testing::bit_equal;
using testing::Collected;
using testing::config;
using testing::prompt;

class PdPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<kestrel::testing::TempDir>();
    kestrel::testing::make_checkpoint("k3-tiny", dir_->path());
    auto e = Engine::load(dir_->path());
    ASSERT_TRUE(e) << e.error().message();
    engine_ = std::move(*e);
  }
  void TearDown() override {
    decode_.reset();
    sched_.reset();
  }

  // Starts pd_peer as the prefill side (mode: pd_peer's, e.g. a put delay) and connects both ways.
  void start(const std::string& mode = "", DecodeHandoffOptions options = {}) {
    std::vector<std::string> args = {KESTREL_PD_PEER, dir_->path()};
    if (!mode.empty()) args.push_back(mode);
    ASSERT_NO_FATAL_FAILURE(child_.spawn(args));
    std::istringstream hello(child_.line(30000ms));
    uint32_t pid = 0;
    std::string& address = address_;
    ASSERT_TRUE(hello >> peer_ >> pid >> address) << "no greeting from pd_peer";
    EXPECT_EQ(pid, static_cast<uint32_t>(child_.pid));
    // The pools allocated as `kestrel serve --role decode` allocates them (through UCX: the prefill process puts
    // into them directly over shared memory).
    auto arenas = DecodeArenas::create(options.worker.transports);
    ASSERT_TRUE(arenas) << arenas.error().message();
    SchedulerConfig sc = config();
    sc.cache.arenas = options.arenas = *arenas;
    auto s = Scheduler::create(*engine_, sc);
    ASSERT_TRUE(s) << s.error().message();
    sched_ = std::move(*s);
    auto d = DecodeHandoff::create(*sched_, options);
    ASSERT_TRUE(d) << d.error().message();
    decode_ = std::move(*d);
    ASSERT_TRUE(decode_->connect(disagg::testing::from_hex(address), peer_).is_ok());
    child_.write_line("connect " + std::to_string(decode_->instance()) + " " +
                      disagg::testing::to_hex(decode_->address()));
    ASSERT_EQ(child_.line(10000ms), "connected");
    const std::set<std::string> allowed = disagg::testing::expected_transports();
    for (const std::string& t : decode_->transports(peer_)) {
      if (!allowed.empty()) {
        EXPECT_TRUE(allowed.count(t)) << "lane uses " << t;
      }
    }
  }

  Collected colocated(const std::vector<int32_t>& ids, int max_new) {
    auto s = Scheduler::create(*engine_, config());
    EXPECT_TRUE(s) << s.error().message();
    Client c;
    EXPECT_TRUE((*s)->submit(c.make(ids, max_new)));
    return c.wait();
  }

  std::unique_ptr<kestrel::testing::TempDir> dir_;
  std::unique_ptr<Engine> engine_;
  Child child_;
  uint64_t peer_ = 0;
  std::string address_;  // pd_peer's worker address (hex)
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<DecodeHandoff> decode_;
};

TEST_F(PdPeer, DecodeEqualsColocatedBitwise) {
  ASSERT_NO_FATAL_FAILURE(start());
  uint64_t room = 1;
  for (int n : testing::prompt_lengths()) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    const Collected want = colocated(prompt(n, n), 8);
    Client c;
    ASSERT_TRUE(decode_->submit(c.make(prompt(n, n), 8), room, peer_));
    child_.write_line("run " + std::to_string(room) + " " + std::to_string(n) + " " + std::to_string(n) + " 8");
    const Collected got = c.wait();
    EXPECT_EQ(child_.line(10000ms), "done " + std::to_string(room) + " length 1");
    EXPECT_EQ(got.finish, FinishReason::kLength) << got.error;
    EXPECT_TRUE(bit_equal(got, want)) << "hand-off changed the generation";
    ++room;
  }
  const ServiceStats st = testing::settled(*sched_);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  const DecodeCounts dc = decode_->counts();
  EXPECT_EQ(dc.received, testing::prompt_lengths().size());
  EXPECT_EQ(dc.registry.held_ranges, 0u);
}

TEST_F(PdPeer, KilledPrefillFailsCleanlyAndLeaksNothing) {
  ASSERT_NO_FATAL_FAILURE(start("5000"));  // the second range of every transfer waits 5 s: killed in between
  Client c;
  ASSERT_TRUE(decode_->submit(c.make(prompt(40, 2), 8), 9, peer_));
  child_.write_line("run 9 40 2 8");
  // The transfer is under way once the decode side has advertised its memory and the first put had time to land.
  for (int i = 0; i < 1000 && decode_->counts().registry.in_flight == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(decode_->counts().registry.in_flight, 1u);
  std::this_thread::sleep_for(300ms);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(child_.pid, SIGKILL), 0);
  const Collected got = c.wait(30s);
  const auto detected = std::chrono::steady_clock::now() - killed_at;
  EXPECT_EQ(got.finish, FinishReason::kError);
  EXPECT_NE(got.error.find("hand-off from prefill failed"), std::string::npos) << got.error;
  EXPECT_TRUE(got.tokens.empty()) << "a token was emitted from a partial state";
  EXPECT_LT(detected, 5s) << "the dead peer was noticed only by the transfer deadline";
  ASSERT_NE(child_.reap(5000ms), -1);  // gone (reaped): now it certainly cannot write
  const ServiceStats st = testing::settled(*sched_);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  const DecodeCounts dc = decode_->counts();
  EXPECT_EQ(dc.failed, 1u);
  EXPECT_EQ(dc.quarantined, 0u);
  EXPECT_EQ(dc.registry.in_flight, 0u);
  EXPECT_EQ(dc.registry.quarantined, 0u);
  EXPECT_EQ(dc.registry.held_ranges, 0u);
  EXPECT_EQ(dc.registry.released_after_close, 1u);
}

// pd_peer's "stats" line as numbers: BLOCKS SLOTS IN_FLIGHT DONE FAILED X Y (see peer_main.cpp).
std::vector<uint64_t> peer_stats(Child& child) {
  child.write_line("stats");
  std::istringstream in(child.line(10000ms));
  std::string word;
  in >> word;
  EXPECT_EQ(word, "stats");
  std::vector<uint64_t> v(7, ~uint64_t{0});
  for (uint64_t& x : v) in >> x;
  return v;
}

// Waits (bounded) until the stopped child is reported stopped by waitpid.
bool wait_stopped(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG | WUNTRACED) == pid && WIFSTOPPED(status)) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST_F(PdPeer, FrozenPrefillFailsAndLateWritesStayQuarantined) {
  const bool tcp = disagg::testing::expected_transports().count("tcp") != 0;
  DecodeHandoffOptions options;
  options.silence = 1000ms;
  ASSERT_NO_FATAL_FAILURE(start("stop", options));  // pd_peer stops itself before the second put of a transfer
  const std::vector<int32_t> ids = prompt(40, 2);
  const Collected want = colocated(ids, 8);
  Client c;
  ASSERT_TRUE(decode_->submit(c.make(ids, 8), 9, peer_));
  child_.write_line("run 9 40 2 8");
  ASSERT_TRUE(wait_stopped(child_.pid, 30000ms)) << "pd_peer did not stop in its transfer";
  const auto stopped_at = std::chrono::steady_clock::now();
  const Collected got = c.wait(30s);
  EXPECT_LT(std::chrono::steady_clock::now() - stopped_at, 5s) << "the frozen peer was noticed only by a deadline";
  EXPECT_EQ(got.finish, FinishReason::kError);
  EXPECT_NE(got.error.find("hand-off from prefill failed"), std::string::npos) << got.error;
  EXPECT_NE(got.error.find("silent"), std::string::npos) << got.error;
  EXPECT_TRUE(got.tokens.empty()) << "a token was emitted from a partial state";
  EXPECT_FALSE(decode_->connected(peer_)) << "the connection to the frozen prefill was kept";
  DecodeCounts dc = decode_->counts();
  EXPECT_EQ(dc.failed, 1u);
  EXPECT_EQ(dc.failed_peer, 1u);
  EXPECT_EQ(dc.received, 0u);
  if (tcp) {
    // The peer's writes all come through the connection, closed now: the memory is back at once.
    const ServiceStats st = testing::settled(*sched_);
    EXPECT_EQ(st.kv_blocks_used, 0);
    EXPECT_EQ(st.state_slots_used, 0);
    EXPECT_EQ(decode_->counts().registry.released_after_close, 1u);
  } else {
    // The frozen peer writes directly into this process once it runs again: the slot and pages stay held.
    std::this_thread::sleep_for(300ms);
    dc = decode_->counts();
    EXPECT_EQ(dc.quarantined, 1u);
    EXPECT_EQ(dc.registry.quarantined, 1u);
    EXPECT_EQ(sched_->stats().state_slots_used, 1);
    EXPECT_GT(sched_->stats().kv_blocks_used, 0);
  }
  // SIGCONT: the prefill finishes its puts (shared memory: into the quarantined memory; tcp: into a closed
  // connection, which fails them) and ends its request; nothing more reaches the decode client.
  ASSERT_EQ(kill(child_.pid, SIGCONT), 0);
  const std::string done = child_.line(30000ms);
  EXPECT_EQ(done.rfind("done 9 ", 0), 0u) << done;
  std::vector<uint64_t> ps = peer_stats(child_);
  EXPECT_EQ(ps[0], 0u) << "prefill pages held";
  EXPECT_EQ(ps[1], 0u) << "prefill slots held";
  EXPECT_EQ(ps[2], 0u) << "prefill hand-offs in flight";
  dc = decode_->counts();
  EXPECT_EQ(dc.received, 0u) << "a late completion was accepted";
  EXPECT_EQ(dc.failed, 1u);
  if (!tcp) {
    EXPECT_EQ(dc.quarantined, 1u) << "the quarantine ended while the peer process lives";
    EXPECT_EQ(sched_->stats().state_slots_used, 1);
  }
  // A new connection and a new hand-off while the old memory is (or was) quarantined: exact, so the late writes
  // landed nowhere else.
  ASSERT_TRUE(decode_->connect(disagg::testing::from_hex(address_), peer_).is_ok());
  child_.write_line("connect " + std::to_string(decode_->instance()) + " " + disagg::testing::to_hex(decode_->address()));
  ASSERT_EQ(child_.line(10000ms), "connected");
  // The stop fault fires at every transfer's second put: the next one runs with SIGCONT sent as soon as it stops.
  Client again;
  ASSERT_TRUE(decode_->submit(again.make(ids, 8), 10, peer_));
  child_.write_line("run 10 40 2 8");
  ASSERT_TRUE(wait_stopped(child_.pid, 30000ms));
  ASSERT_EQ(kill(child_.pid, SIGCONT), 0);
  const Collected second = again.wait(30s);
  EXPECT_EQ(second.finish, FinishReason::kLength) << second.error;
  EXPECT_TRUE(bit_equal(second, want)) << "a hand-off next to the quarantined memory changed the generation";
  EXPECT_EQ(child_.line(10000ms), "done 10 length 1");
  // The quarantine ends only when the peer can no longer write: shared memory: its process gone.
  if (!tcp) {
    EXPECT_EQ(decode_->counts().quarantined, 1u);
    ASSERT_EQ(kill(child_.pid, SIGKILL), 0);
    ASSERT_NE(child_.reap(5000ms), -1);
  }
  const ServiceStats st = testing::settled(*sched_);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  dc = decode_->counts();
  EXPECT_EQ(dc.quarantined, 0u);
  EXPECT_EQ(dc.quarantined_bytes, 0u);
  EXPECT_EQ(dc.in_flight, 0u);
  EXPECT_EQ(dc.registry.in_flight, 0u);
  EXPECT_EQ(dc.registry.quarantined, 0u);
  EXPECT_EQ(dc.registry.held_ranges, 0u);
}

// The test is the prefill side here, pd_peer the decode side; the prefill's first put of the transfer stops the
// decode process, the lease runs out while it is stopped.
// The stop is confirmed (the process's state in /proc) before the put is posted.
bool is_stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
}

class StopPeerOnFirstPut : public disagg::FaultPolicy {
 public:
  std::atomic<pid_t> pid{-1};
  disagg::PutFault on_put(uint64_t, size_t index, size_t) override {
    if (index == 0 && pid > 0) {
      kill(pid, SIGSTOP);
      for (int i = 0; i < 1000 && !is_stopped(pid); ++i) std::this_thread::sleep_for(1ms);
    }
    return {};
  }
  bool drop_message(uint16_t) override { return false; }
  bool stall_progress() override { return false; }
};

TEST_F(PdPeer, FrozenDecodeLosesTheLease) {
  const bool tcp = disagg::testing::expected_transports().count("tcp") != 0;
  ASSERT_NO_FATAL_FAILURE(child_.spawn({KESTREL_PD_PEER, dir_->path(), "decode"}));
  std::istringstream hello(child_.line(30000ms));
  uint64_t decode_instance = 0;
  uint32_t pid = 0;
  std::string address;
  ASSERT_TRUE(hello >> decode_instance >> pid >> address) << "no greeting from pd_peer";
  auto s = Scheduler::create(*engine_, config());
  ASSERT_TRUE(s) << s.error().message();
  sched_ = std::move(*s);
  StopPeerOnFirstPut stop;
  PrefillHandoffOptions options;
  options.lease = 1000ms;
  options.transfer_timeout = std::chrono::minutes(10);  // only the lease can end the transfer early
  options.worker.faults = &stop;
  auto p = PrefillHandoff::create(*sched_, options);
  ASSERT_TRUE(p) << p.error().message();
  std::unique_ptr<PrefillHandoff> prefill = std::move(*p);
  ASSERT_TRUE(prefill->connect(disagg::testing::from_hex(address), decode_instance).is_ok());
  child_.write_line("connect " + std::to_string(prefill->instance()) + " " + disagg::testing::to_hex(prefill->address()));
  ASSERT_EQ(child_.line(10000ms), "connected");
  const std::vector<int32_t> ids = prompt(40, 2);
  child_.write_line("receive 11 40 2 8 " + std::to_string(prefill->instance()));
  stop.pid = child_.pid;
  Client c;
  ASSERT_TRUE(prefill->submit(c.make(ids, 8), 11));
  const Collected got = c.wait(60s);
  ASSERT_TRUE(wait_stopped(child_.pid, 1000ms)) << "the decode process was not stopped by the transfer";
  // The pages are free while the decode side is still stopped.
  const ServiceStats st = testing::settled(*sched_);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  const PrefillCounts pc = prefill->counts();
  EXPECT_EQ(pc.in_flight, 0u);
  // The flush needs the stopped decode's acknowledgement: only the lease ends it.
  EXPECT_EQ(got.finish, FinishReason::kError);
  EXPECT_NE(got.error.find("lease expired"), std::string::npos) << got.error;
  EXPECT_EQ(pc.lease_expired, 1u);
  ASSERT_EQ(kill(child_.pid, SIGCONT), 0);
  EXPECT_EQ(child_.line(30000ms), "done 11 error 0") << "the decode side decoded from a state whose lease expired";
  // tcp: the decode side's quarantine ended with the closed connection, it holds nothing. Shared memory: its
  // memory stays quarantined while the writer (this process) lives.
  std::vector<uint64_t> ds;
  for (int i = 0; i < 100; ++i) {
    ds = peer_stats(child_);
    if (tcp ? ds[0] == 0 && ds[1] == 0 && ds[5] == 0 && ds[6] == 0 : ds[2] == 0 && ds[4] == 1) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(ds[2], 0u) << "decode hand-offs in flight";
  EXPECT_EQ(ds[3], 0u) << "decode hand-offs received";
  EXPECT_EQ(ds[4], 1u) << "decode hand-offs failed";
  EXPECT_EQ(ds[1], tcp ? 0u : 1u) << "decode slots held";
  EXPECT_EQ(ds[5], tcp ? 0u : 1u) << "decode hand-offs quarantined";
  if (tcp) {
    EXPECT_EQ(ds[0], 0u) << "decode pages held";
    EXPECT_EQ(ds[6], 0u) << "decode registry ranges held";
  }
  prefill.reset();
}

// The prefill's worker progresses only when told (a frozen reader of its receive queue).
class HoldProgress : public disagg::FaultPolicy {
 public:
  std::atomic<bool> hold{false};
  disagg::PutFault on_put(uint64_t, size_t, size_t) override { return {}; }
  bool drop_message(uint16_t) override { return false; }
  bool stall_progress() override { return hold; }
};

// Starts `pd_peer decode-ucx` in `child` and connects it and `prefill` both ways; returns once the prefill has
// heard from it (its endpoint to the prefill is wired up: it can send without the prefill's help).
void start_decode(Child& child, const std::string& checkpoint, PrefillHandoff& prefill) {
  ASSERT_NO_FATAL_FAILURE(child.spawn({KESTREL_PD_PEER, checkpoint, "decode-ucx"}));
  std::istringstream hello(child.line(30000ms));
  uint64_t instance = 0;
  uint32_t pid = 0;
  std::string address;
  ASSERT_TRUE(hello >> instance >> pid >> address) << "no greeting from pd_peer";
  ASSERT_TRUE(prefill.connect(disagg::testing::from_hex(address), instance).is_ok());
  child.write_line("connect " + std::to_string(prefill.instance()) + " " + disagg::testing::to_hex(prefill.address()));
  ASSERT_EQ(child.line(10000ms), "connected");
  for (int i = 0; i < 1000 && !prefill.last_heard(instance); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(prefill.last_heard(instance)) << "no heartbeat from the decode";
}

// The test is the prefill side, pd_peer the decode side with its pools allocated through UCX (over shared memory
// System V segments, as in `kestrel serve --role decode`). Over shared memory the decode advertises while the
// prefill's worker does not progress, so its destinations wait unread in the prefill's receive queue; it is then
// killed and reaped, and only then does the prefill read them (its request comes after). Unpacking the dead
// decode's keys made UCX 1.13 crash this process (the segments are gone, UCX's unpack error path dereferences the
// key): the prefill must not unpack them, must fail the hand-off, hold nothing, and hand off to a fresh decode
// next. Over tcp (a key there maps nothing) the worker is not held: the decode cannot send while it is (the
// connection's wireup needs its progress); the decode is killed once its destinations went out.
TEST_F(PdPeer, DecodeKilledBeforeItsDestinationsAreReadIsNotUnpacked) {
  const bool tcp = disagg::testing::expected_transports().count("tcp") != 0;
  auto s = Scheduler::create(*engine_, config());
  ASSERT_TRUE(s) << s.error().message();
  sched_ = std::move(*s);
  HoldProgress faults;
  PrefillHandoffOptions options;
  options.worker.faults = &faults;
  options.destinations_timeout = 5000ms;  // tcp: destinations lost with the connection end at this deadline
  auto p = PrefillHandoff::create(*sched_, options);
  ASSERT_TRUE(p) << p.error().message();
  std::unique_ptr<PrefillHandoff> prefill = std::move(*p);
  ASSERT_NO_FATAL_FAILURE(start_decode(child_, dir_->path(), *prefill));
  faults.hold = !tcp;
  child_.write_line("receive 21 40 2 8 " + std::to_string(prefill->instance()));
  std::string advertised;  // the destinations sent: over shared memory in this side's receive queue
  for (int i = 0; i < 200 && advertised != "advertised 1"; ++i) {
    child_.write_line("advertised");
    advertised = child_.line(10000ms);
    if (advertised != "advertised 1") std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(advertised, "advertised 1") << "the decode never advertised";
  ASSERT_EQ(kill(child_.pid, SIGKILL), 0);
  ASSERT_NE(child_.reap(5000ms), -1);
  faults.hold = false;
  Client c;
  ASSERT_TRUE(prefill->submit(c.make(prompt(40, 2), 8), 21));
  const Collected got = c.wait(60s);
  EXPECT_EQ(got.finish, FinishReason::kError);
  if (!tcp) {
    EXPECT_NE(got.error.find("has exited"), std::string::npos) << got.error;
  }
  PrefillCounts pc = prefill->counts();
  EXPECT_EQ(pc.failed, 1u);
  EXPECT_EQ(pc.handed_off, 0u);
  EXPECT_EQ(pc.in_flight, 0u);
  if (!tcp) {
    EXPECT_EQ(pc.transfer_failed, 1u);
  }
  ServiceStats st = testing::settled(*sched_);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  // A fresh decode process gets the next hand-off.
  Child fresh;
  ASSERT_NO_FATAL_FAILURE(start_decode(fresh, dir_->path(), *prefill));
  fresh.write_line("receive 22 40 2 8 " + std::to_string(prefill->instance()));
  Client c2;
  ASSERT_TRUE(prefill->submit(c2.make(prompt(40, 2), 8), 22));
  EXPECT_EQ(c2.wait(60s).finish, FinishReason::kLength);
  EXPECT_EQ(fresh.line(30000ms), "done 22 length 8");
  pc = prefill->counts();
  EXPECT_EQ(pc.handed_off, 1u);
  EXPECT_EQ(pc.in_flight, 0u);
  st = testing::settled(*sched_);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  prefill.reset();
}

}  // namespace
}  // namespace kestrel::pd
