// The hand-off in one process: a prefill scheduler and a decode scheduler, each on its own engine loaded from the
// same tiny checkpoint (K3 hybrid KDA + MLA, K3 with DSA layers, DeepSeek V3 pure MLA), their hand-off sides
// connected over the transports UCX_TLS selects (ctest runs this binary with UCX_TLS=shm and UCX_TLS=tcp).
//   - Parity: the decoded tokens, logprobs and top logprobs equal a colocated run bit for bit (prompts of one
//     token, a page boundary ± 1, several chunks), and both schedulers end with no page, slot or transfer held.
//   - The state matters: a prefill that sends zeros instead of the KDA conv state, the recurrent state, the
//     indexer keys or the MLA pages (sizes and checksum consistent, so the transfer itself succeeds) gives
//     different logprobs: the parity test would catch a part left out.
//   - Faults: a dropped put, a corrupted byte, a lost completion fail the request with a clear error and nothing
//     is admitted; over tcp the quarantined memory returns once the connection is closed; over shared memory it
//     stays quarantined while the peer process (here: this one) lives.
//   - Leases and deadlines: a slow transfer to a live decode side outlasts the prefill's lease (heartbeats renew
//     it); a decode side frozen after advertising loses it and the prefill frees the pages where the flush needs
//     the decode (tcp; registered pools over shared memory), while over shared memory into pools UCX allocated the
//     puts need nothing from the frozen decode, which decodes exactly once it runs again; a decode reservation
//     made after the prefill's destinations deadline is withdrawn at once.
//   - Cancels: a cancel on either side releases both at once with 10-minute deadlines; a decode-side cancel
//     reaches the prefill as a cancel message (before the first put, mid-transfer, while the prompt runs, before
//     the prefill's request came), the prefill stops, and the decode's memory returns on its confirmation.
// The decode scheduler's pools are allocated as a decode server allocates them (DecodeArenas) unless a test says
// otherwise.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include "common/test_util.h"
#include "disagg/pair.h"
#include "pd/decode_handoff.h"
#include "pd/prefill_handoff.h"
#include "pd_util.h"

namespace kestrel::pd {
namespace {

using namespace std::chrono_literals;
using kestrel::testing::Client;
using testing::bit_equal;
using testing::Collected;
using testing::config;
using testing::prompt;
using testing::settled;

class Handoff : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<kestrel::testing::TempDir>();
    kestrel::testing::make_checkpoint(GetParam(), dir_->path());
    auto p = Engine::load(dir_->path());
    ASSERT_TRUE(p) << p.error().message();
    prefill_engine_ = std::move(*p);
    auto d = Engine::load(dir_->path());
    ASSERT_TRUE(d) << d.error().message();
    decode_engine_ = std::move(*d);
  }
  void TearDown() override { close_pair(); }

  const CacheGeometry& geometry() const { return prefill_engine_->model().cache_geometry(); }

  Collected colocated(const std::vector<int32_t>& ids, int max_new) {
    auto s = Scheduler::create(*prefill_engine_, config());
    EXPECT_TRUE(s) << s.error().message();
    Client c;
    EXPECT_TRUE((*s)->submit(c.make(ids, max_new)));
    return c.wait();
  }

  // ucx_pools: the decode scheduler's pools allocated through UCX (DecodeArenas, as `kestrel serve --role decode`
  // does); otherwise heap pools, registered by the hand-off.
  // by_listener: the decode side connects to the prefill side's UCX listener (po.listen_host, over tcp) as a
  // decode server does; otherwise each side connects to the other's worker address.
  void open_pair(PrefillHandoffOptions po = {}, DecodeHandoffOptions dopt = {}, bool ucx_pools = true,
                 bool by_listener = false) {
    auto ps = Scheduler::create(*prefill_engine_, prefill_config_);
    ASSERT_TRUE(ps) << ps.error().message();
    prefill_sched_ = std::move(*ps);
    SchedulerConfig dc = config();
    if (ucx_pools) {
      auto arenas = DecodeArenas::create(dopt.worker.transports);
      ASSERT_TRUE(arenas) << arenas.error().message();
      dc.cache.arenas = dopt.arenas = *arenas;
    }
    auto ds = Scheduler::create(*decode_engine_, dc);
    ASSERT_TRUE(ds) << ds.error().message();
    decode_sched_ = std::move(*ds);
    if (po.worker.faults == nullptr) po.worker.faults = &faults_;
    auto p = PrefillHandoff::create(*prefill_sched_, po);
    ASSERT_TRUE(p) << p.error().message();
    prefill_ = std::move(*p);
    auto d = DecodeHandoff::create(*decode_sched_, dopt);
    ASSERT_TRUE(d) << d.error().message();
    decode_ = std::move(*d);
    if (by_listener) {
      ASSERT_NE(prefill_->listener_port(), 0);
      ASSERT_TRUE(decode_->connect_sockaddr(po.listen_host, prefill_->listener_port(), prefill_->instance()).is_ok());
      return;
    }
    ASSERT_TRUE(decode_->connect(prefill_->address(), prefill_->instance()).is_ok());
    ASSERT_TRUE(prefill_->connect(decode_->address(), decode_->instance()).is_ok());
  }
  // Hand-offs first (they hold the schedulers' memory), then the schedulers.
  void close_pair() {
    prefill_.reset();
    decode_.reset();
    prefill_sched_.reset();
    decode_sched_.reset();
  }

  // One request through the pair; the decode side's events (the first token included) are returned, the prefill
  // side's are checked: the same first token, then kLength (handed off) or kError.
  Collected handed_off(const std::vector<int32_t>& ids, int max_new, uint64_t room, Collected* prefill_out = nullptr) {
    Client pc, dc;
    auto d = decode_->submit(dc.make(ids, max_new), room, prefill_->instance());
    EXPECT_TRUE(d) << d.error().message();
    auto p = prefill_->submit(pc.make(ids, max_new), room);
    EXPECT_TRUE(p) << p.error().message();
    Collected dres = dc.wait(), pres = pc.wait();
    EXPECT_EQ(pres.tokens.size(), 1u) << "the prefill side generates exactly the first token";
    if (!pres.tokens.empty() && dres.finish != FinishReason::kError) {
      EXPECT_FALSE(dres.tokens.empty());
      if (!dres.tokens.empty()) {
        EXPECT_EQ(pres.tokens[0], dres.tokens[0]);
      }
    }
    if (prefill_out != nullptr) *prefill_out = pres;
    return dres;
  }

  // Both schedulers hold nothing, no transfer is in flight or quarantined.
  void expect_no_leaks() {
    const ServiceStats ps = settled(*prefill_sched_), ds = settled(*decode_sched_);
    EXPECT_EQ(ps.kv_blocks_used, 0);
    EXPECT_EQ(ps.state_slots_used, 0);
    EXPECT_EQ(ds.kv_blocks_used, 0);
    EXPECT_EQ(ds.state_slots_used, 0);
    EXPECT_EQ(prefill_->counts().in_flight, 0u);
    const DecodeCounts dc = decode_->counts();
    EXPECT_EQ(dc.in_flight, 0u);
    EXPECT_EQ(dc.quarantined, 0u);
    EXPECT_EQ(dc.registry.in_flight, 0u);
    EXPECT_EQ(dc.quarantined_bytes, 0u);
    EXPECT_EQ(dc.registry.quarantined, 0u);
    EXPECT_EQ(dc.registry.held_ranges, 0u);
  }

  // Requests that take the prefill scheduler's running slots for a while (plain requests, no hand-off): with
  // prefill_config_.cache.max_slots = 1, a hand-off request submitted after them waits in the prefill's queue.
  std::vector<std::unique_ptr<Client>> hold_prefill(int requests, int tokens) {
    std::vector<std::unique_ptr<Client>> held;
    for (int i = 0; i < requests; ++i) {
      held.push_back(std::make_unique<Client>());
      EXPECT_TRUE(prefill_sched_->submit(held.back()->make(prompt(20, 90 + i), tokens)));
    }
    return held;
  }

  SchedulerConfig prefill_config_ = config();
  std::unique_ptr<kestrel::testing::TempDir> dir_;
  std::unique_ptr<Engine> prefill_engine_, decode_engine_;
  std::unique_ptr<Scheduler> prefill_sched_, decode_sched_;
  std::unique_ptr<PrefillHandoff> prefill_;
  std::unique_ptr<DecodeHandoff> decode_;
  kestrel::disagg::testing::ScriptedFaults faults_;
  // Fault policies a test gives a side: they must outlive it (close_pair runs in TearDown, after the test body).
  std::vector<std::unique_ptr<kestrel::disagg::FaultPolicy>> owned_faults_;
};

TEST_P(Handoff, DecodeEqualsColocatedBitwise) {
  open_pair();
  for (const char* side : {"decode", "prefill"}) {
    const uint64_t peer = std::string(side) == "decode" ? prefill_->instance() : decode_->instance();
    auto& h = std::string(side) == "decode" ? static_cast<HandoffSide&>(*decode_) : static_cast<HandoffSide&>(*prefill_);
    std::vector<std::string> lanes = h.transports(peer);
    ASSERT_FALSE(lanes.empty());
    const std::set<std::string> allowed = kestrel::disagg::testing::expected_transports();
    for (const std::string& t : lanes) {
      if (!allowed.empty()) {
        EXPECT_TRUE(allowed.count(t)) << side << " lane uses " << t;
      }
    }
  }
  uint64_t room = 1;
  for (int n : testing::prompt_lengths()) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    const std::vector<int32_t> ids = prompt(n, n);
    const Collected want = colocated(ids, 8);
    ASSERT_EQ(want.tokens.size(), 8u);
    const Collected got = handed_off(ids, 8, room++);
    EXPECT_EQ(got.finish, FinishReason::kLength) << got.error;
    EXPECT_TRUE(bit_equal(got, want)) << "hand-off changed the generation";
  }
  const DecodeCounts dc = decode_->counts();
  EXPECT_EQ(dc.received, testing::prompt_lengths().size());
  EXPECT_EQ(dc.failed, 0u);
  EXPECT_EQ(dc.started, testing::prompt_lengths().size());
  EXPECT_EQ(dc.seconds.n(), static_cast<int64_t>(testing::prompt_lengths().size()));
  const PrefillCounts pc = prefill_->counts();
  EXPECT_EQ(pc.handed_off, testing::prompt_lengths().size());
  EXPECT_EQ(pc.started, pc.handed_off);
  EXPECT_EQ(pc.bytes, dc.bytes);
  EXPECT_EQ(pc.seconds.n(), static_cast<int64_t>(pc.handed_off));
  expect_no_leaks();
}

// Seeded sampling continues the prefill's random stream: the decode side skips the one draw the prefill made.
TEST_P(Handoff, SeededSamplingEqualsColocated) {
  open_pair();
  const std::vector<int32_t> ids = prompt(37, 12);
  Client c;
  auto s = Scheduler::create(*prefill_engine_, config());
  ASSERT_TRUE(s);
  ASSERT_TRUE((*s)->submit(c.make(ids, 10, /*temperature=*/0.9f)));
  const Collected want = c.wait();
  s->reset();
  Client pc, dc;
  ASSERT_TRUE(decode_->submit(dc.make(ids, 10, 0.9f), 55, prefill_->instance()));
  ASSERT_TRUE(prefill_->submit(pc.make(ids, 10, 0.9f), 55));
  const Collected got = dc.wait();
  EXPECT_EQ(pc.wait().finish, FinishReason::kLength);
  EXPECT_TRUE(bit_equal(got, want)) << "sampled tokens diverged after the hand-off";
  expect_no_leaks();
}

// Several requests handed off at once (both sides' schedulers batch them) still equal their colocated runs.
TEST_P(Handoff, ConcurrentHandoffsEqualColocated) {
  open_pair();
  const int kN = 3;
  std::vector<Collected> want;
  for (int i = 0; i < kN; ++i) want.push_back(colocated(prompt(20 + 13 * i, 40 + i), 6));
  Client pc[kN], dc[kN];
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(decode_->submit(dc[i].make(prompt(20 + 13 * i, 40 + i), 6), 100 + i, prefill_->instance()));
  }
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(prefill_->submit(pc[i].make(prompt(20 + 13 * i, 40 + i), 6), 100 + i));
  for (int i = 0; i < kN; ++i) {
    const Collected got = dc[i].wait();
    EXPECT_TRUE(bit_equal(got, want[static_cast<size_t>(i)])) << "request " << i << ": " << got.error << " tokens " << got.tokens.size();
    const Collected p = pc[i].wait();
    EXPECT_EQ(p.finish, FinishReason::kLength) << p.error;
  }
  expect_no_leaks();
}

// Each part of the state, sent as zeros while everything else is right, changes the output: leaving any of them
// out of the hand-off cannot pass the parity test.
TEST_P(Handoff, EveryPartOfTheStateMatters) {
  std::vector<std::pair<Part, const char*>> parts = {{Part::kMla, "MLA pages"}};
  if (!geometry().kda_layers.empty()) {
    parts.push_back({Part::kConv, "KDA conv state"});
    parts.push_back({Part::kRecurrent, "KDA recurrent state"});
  }
  if (!geometry().sparse_layers.empty()) parts.push_back({Part::kIndex, "DSA indexer keys"});
  const std::vector<int32_t> ids = prompt(40, 9);
  const Collected want = colocated(ids, 6);
  for (auto [part, name] : parts) {
    SCOPED_TRACE(name);
    PrefillHandoffOptions po;
    po.zeroed_parts = {part};
    open_pair(po);
    const Collected got = handed_off(ids, 6, 7);
    EXPECT_EQ(got.finish, FinishReason::kLength) << "the transfer itself succeeds: " << got.error;
    EXPECT_FALSE(bit_equal(got, want)) << name << " sent as zeros, yet the output is unchanged";
    expect_no_leaks();
    close_pair();
  }
}

// A fault on the data path fails the request cleanly: the decode client gets an error naming the hand-off,
// nothing is decoded, the prefill's pages are freed; the decode's reserved memory is quarantined until the peer
// can no longer write (tcp: connection closed; shared memory: peer process gone, never here).
class HandoffFault : public Handoff {
 protected:
  // `reason`: the DecodeCounts failure counter this failure must land in.
  // Every deadline 10 minutes away: whatever ends in such a test ends because of a cancel or a withdrawal (or the
  // test runs into its own time limit).
  void open_pair_far_deadlines() {
    PrefillHandoffOptions p;
    p.destinations_timeout = p.transfer_timeout = std::chrono::minutes(10);
    DecodeHandoffOptions d;
    d.transfer_timeout = std::chrono::minutes(10);
    open_pair(p, d);
  }

  void expect_failed_cleanly(const Collected& got, const char* why, uint64_t DecodeCounts::*reason) {
    EXPECT_EQ(got.finish, FinishReason::kError);
    EXPECT_NE(got.error.find("hand-off"), std::string::npos) << got.error;
    EXPECT_NE(got.error.find(why), std::string::npos) << got.error;
    EXPECT_TRUE(got.tokens.empty()) << "a token was emitted from an unverified state";
    const ServiceStats ps = settled(*prefill_sched_);
    EXPECT_EQ(ps.kv_blocks_used, 0);
    EXPECT_EQ(ps.state_slots_used, 0);
    const DecodeCounts dc = decode_->counts();
    EXPECT_EQ(dc.failed, 1u);
    EXPECT_EQ(dc.*reason, 1u);
    if (kestrel::disagg::testing::expected_transports().count("tcp") != 0) {
      expect_no_leaks();
    } else {
      // Shared memory, one process: the writer (this process) lives, so the memory must stay held.
      std::this_thread::sleep_for(200ms);
      const DecodeCounts later = decode_->counts();
      EXPECT_EQ(later.quarantined, 1u);
      EXPECT_GT(later.quarantined_bytes, 0u);
      EXPECT_EQ(later.registry.quarantined, 1u);
      EXPECT_GT(decode_sched_->stats().kv_blocks_used, 0);
      EXPECT_EQ(decode_sched_->stats().state_slots_used, 1);
    }
  }
};

TEST_P(HandoffFault, DroppedPut) {
  faults_.puts = {{1, {kestrel::disagg::PutFault::Kind::kDrop}}};
  open_pair();
  expect_failed_cleanly(handed_off(prompt(40, 3), 6, 5), "checksum", &DecodeCounts::failed_corrupt);
}

// Drops the second put of the first transfer only (on_put runs on the prefill side's thread).
class DropInFirstTransfer : public kestrel::disagg::testing::ScriptedFaults {
 public:
  kestrel::disagg::PutFault on_put(uint64_t id, size_t index, size_t) override {
    if (first_ == 0) first_ = id;
    if (id == first_ && index == 1) return {kestrel::disagg::PutFault::Kind::kDrop};
    return ScriptedFaults::on_put(id, index, 0);
  }

 private:
  uint64_t first_ = 0;
};

// Over tcp a decode server connects to the prefill's UCX listener (client-server: UCX wires the tcp lanes
// endpoint to endpoint, docs/disaggregation.md "Link down over tcp"); the prefill learns the decode's instance from the
// connection request. A failed hand-off gives the connection up on both sides (forced closes of such endpoints);
// the decode connects again, the prefill replaces its endpoint, and the next hand-off is exact. Over shared memory
// the prefill side opens no listener (UCX's client-server connections need tcp).
TEST_P(HandoffFault, DecodeConnectsToThePrefillListenerOverTcp) {
  PrefillHandoffOptions po;
  po.listen_host = "127.0.0.1";
  // Owned by the fixture: the pair's threads may still call it until close_pair in TearDown.
  po.worker.faults = owned_faults_.emplace_back(std::make_unique<DropInFirstTransfer>()).get();
  if (kestrel::disagg::testing::expected_transports().count("tcp") == 0) {
    open_pair(po);
    EXPECT_EQ(prefill_->listener_port(), 0);
    GTEST_SKIP() << "UCX client-server connections need tcp";
  }
  open_pair(po, {}, true, /*by_listener=*/true);
  for (std::string t : decode_->transports(prefill_->instance())) EXPECT_EQ(t, "tcp");
  expect_failed_cleanly(handed_off(prompt(40, 3), 6, 5), "checksum", &DecodeCounts::failed_corrupt);
  EXPECT_FALSE(decode_->connected(prefill_->instance())) << "a failed hand-off gives the connection up";
  ASSERT_TRUE(decode_->connect_sockaddr("127.0.0.1", prefill_->listener_port(), prefill_->instance()).is_ok());
  const std::vector<int32_t> ids = prompt(40, 4);
  const Collected want = colocated(ids, 6);
  const Collected got = handed_off(ids, 6, 6);
  EXPECT_EQ(got.finish, FinishReason::kLength) << got.error;
  EXPECT_TRUE(bit_equal(got, want)) << "hand-off over the new connection changed the generation";
  EXPECT_EQ(prefill_->transports(decode_->instance()), std::vector<std::string>{"tcp"})
      << "the prefill side keys the accepted endpoint by the decode's instance";
  expect_no_leaks();
}

TEST_P(HandoffFault, CorruptedByte) {
  faults_.puts = {{0, {kestrel::disagg::PutFault::Kind::kCorrupt, 17}}};
  open_pair();
  expect_failed_cleanly(handed_off(prompt(40, 3), 6, 5), "checksum", &DecodeCounts::failed_corrupt);
}

TEST_P(HandoffFault, LostCompletion) {
  faults_.dropped_kinds = {static_cast<uint16_t>(kestrel::disagg::MessageKind::kCompletion)};
  DecodeHandoffOptions d;
  d.transfer_timeout = 1500ms;
  open_pair({}, d);
  expect_failed_cleanly(handed_off(prompt(40, 3), 6, 5), "deadline", &DecodeCounts::failed_deadline);
}

// A decode side that never gets its request's state (no prefill for that room) fails at its deadline, and its
// prefill-side counterpart (destinations never came) at its own.
TEST_P(HandoffFault, NoCounterpartTimesOut) {
  PrefillHandoffOptions p;
  p.destinations_timeout = 800ms;
  DecodeHandoffOptions d;
  d.transfer_timeout = 800ms;
  open_pair(p, d);
  Client pc, dc;
  ASSERT_TRUE(decode_->submit(dc.make(prompt(30, 1), 4), 21, prefill_->instance()));
  ASSERT_TRUE(prefill_->submit(pc.make(prompt(30, 1), 4), 22));
  const Collected dres = dc.wait(), pres = pc.wait();
  EXPECT_EQ(dres.finish, FinishReason::kError);
  EXPECT_TRUE(dres.tokens.empty());
  EXPECT_EQ(pres.finish, FinishReason::kError);
  EXPECT_NE(pres.error.find("no destinations"), std::string::npos) << pres.error;
  EXPECT_EQ(settled(*prefill_sched_).kv_blocks_used, 0);
  EXPECT_EQ(prefill_->counts().no_destinations, 1u);
  EXPECT_EQ(decode_->counts().failed_deadline, 1u);
}

// A request queued on the prefill behind others for several times the decode's deadline: the prefill holds it and
// the destinations, and says so (kQueued every 20 ms), which renews the decode's deadline; the hand-off then
// completes exactly. Without the notices (next test) the same wait fails at the deadline.
TEST_P(HandoffFault, QueuedNoticesKeepTheDecodeWaitingPastItsDeadline) {
  prefill_config_.cache.max_slots = 1;
  PrefillHandoffOptions p;
  p.queued_interval = 20ms;
  DecodeHandoffOptions d;
  d.transfer_timeout = 100ms;
  open_pair(p, d);
  const std::vector<int32_t> ids = prompt(40, 7);
  const Collected want = colocated(ids, 6);
  auto held = hold_prefill(2, 300);
  const auto t0 = std::chrono::steady_clock::now();
  const Collected got = handed_off(ids, 6, 61);
  const auto waited = std::chrono::steady_clock::now() - t0;
  for (auto& c : held) EXPECT_EQ(c->wait().finish, FinishReason::kLength);
  EXPECT_EQ(got.finish, FinishReason::kLength) << got.error;
  EXPECT_TRUE(bit_equal(got, want)) << "hand-off after a long queue changed the generation";
  ASSERT_GT(waited, 3 * d.transfer_timeout) << "the held requests did not keep the prefill busy past the deadline: "
                                               "the test shows nothing";
  EXPECT_EQ(decode_->counts().failed, 0u);
  expect_no_leaks();
}

TEST_P(HandoffFault, WithoutQueuedNoticesAQueuedPrefillMissesTheDeadline) {
  prefill_config_.cache.max_slots = 1;
  faults_.dropped_kinds = {static_cast<uint16_t>(kestrel::disagg::MessageKind::kQueued)};
  PrefillHandoffOptions p;
  p.queued_interval = 20ms;
  DecodeHandoffOptions d;
  d.transfer_timeout = 100ms;
  open_pair(p, d);
  auto held = hold_prefill(2, 300);
  const Collected got = handed_off(prompt(40, 7), 6, 62);
  for (auto& c : held) EXPECT_EQ(c->wait().finish, FinishReason::kLength);
  expect_failed_cleanly(got, "deadline", &DecodeCounts::failed_deadline);
  EXPECT_NE(got.error.find("last queued notice never"), std::string::npos) << got.error;
}

// The prefill refuses the request (here: its own limits; under load: its full waiting queue) after the decode side
// reserved and advertised for the room. The decode's reservation is answered with a withdrawal: the request ends
// now with a clear error and its memory returns, not at a deadline 10 minutes away.
TEST_P(HandoffFault, PrefillRefusalReleasesTheDecodeReservation) {
  open_pair_far_deadlines();
  Client dc, pc;
  ASSERT_TRUE(decode_->submit(dc.make(prompt(30, 4), 6), 41, prefill_->instance()));
  for (int i = 0; i < 500 && decode_->counts().registry.in_flight == 0; ++i) std::this_thread::sleep_for(5ms);
  auto refused = prefill_->submit(pc.make(prompt(30, 4), 0), 41);
  ASSERT_FALSE(refused);
  const Collected dres = dc.wait(60s);
  EXPECT_EQ(dres.finish, FinishReason::kError);
  EXPECT_TRUE(dres.tokens.empty());
  EXPECT_NE(dres.error.find("ended the request before its hand-off"), std::string::npos) << dres.error;
  EXPECT_EQ(decode_->counts().withdrawn, 1u);
  EXPECT_EQ(decode_->counts().failed, 0u);
  EXPECT_TRUE(decode_->connected(prefill_->instance())) << "a withdrawal keeps the connection";
  expect_no_leaks();
}

// A client cancel while the request is reserved (decode) or parked (prefill). The deadlines are far away (10
// minutes): everything here ends because of the cancel, or the test runs into its own time limit.
TEST_P(HandoffFault, CancelWhileHandedOff) {
  open_pair_far_deadlines();
  // Decode side reserved and advertised, cancelled before its prefill request even came: the prefill remembers
  // the room and answers its destinations with a withdrawal (the decode's memory returns at once, not
  // quarantined), and refuses the request when it comes.
  Client dc;
  auto did = decode_->submit(dc.make(prompt(30, 4), 6), 31, prefill_->instance());
  ASSERT_TRUE(did);
  for (int i = 0; i < 500 && decode_->counts().registry.in_flight == 0; ++i) std::this_thread::sleep_for(5ms);
  decode_sched_->cancel(*did);
  decode_->cancel(*did);
  const Collected dres = dc.wait(60s);
  EXPECT_EQ(dres.finish, FinishReason::kCancelled);
  EXPECT_TRUE(dres.tokens.empty());
  Client pc;
  auto refused = prefill_->submit(pc.make(prompt(30, 4), 6), 31);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("cancelled room 31"), std::string::npos) << refused.error().message();
  EXPECT_EQ(decode_->counts().withdrawn, 1u);
  EXPECT_EQ(decode_->counts().cancelled, 1u);
  EXPECT_EQ(prefill_->counts().cancel_messages, 1u);
  expect_no_leaks();
  // Prefill side parked (first token out), cancelled: released at once, not at its deadline.
  Client lone;
  auto pid = prefill_->submit(lone.make(prompt(30, 5), 6), 32);
  ASSERT_TRUE(pid);
  for (int i = 0; i < 1000 && lone.tokens_so_far() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(lone.tokens_so_far(), 1u);
  prefill_sched_->cancel(*pid);
  prefill_->cancel(*pid);
  EXPECT_EQ(lone.wait().finish, FinishReason::kCancelled);
  EXPECT_EQ(prefill_->counts().cancelled, 1u);
  // The decode side that asks for that room afterwards gets a withdrawal: its reservation returns at once (not
  // quarantined), the request ends with a clear error, and the connection stays usable.
  Client late;
  ASSERT_TRUE(decode_->submit(late.make(prompt(30, 5), 6), 32, prefill_->instance()));
  const Collected lres = late.wait();
  EXPECT_EQ(lres.finish, FinishReason::kError);
  EXPECT_NE(lres.error.find("ended the request before its hand-off"), std::string::npos) << lres.error;
  EXPECT_EQ(decode_->counts().withdrawn, 2u);
  EXPECT_EQ(prefill_->counts().withdrawn, 2u);
  EXPECT_TRUE(decode_->connected(prefill_->instance()));
  expect_no_leaks();
  // Cancelled on the prefill side while its prompt still runs (before parking): the decode reservation made for
  // the room is withdrawn too.
  Client early_p, early_d;
  ASSERT_TRUE(decode_->submit(early_d.make(prompt(300, 6), 6), 33, prefill_->instance()));
  auto eid = prefill_->submit(early_p.make(prompt(300, 6), 6), 33);
  ASSERT_TRUE(eid);
  prefill_sched_->cancel(*eid);
  prefill_->cancel(*eid);
  const Collected ep = early_p.wait(), ed = early_d.wait();
  EXPECT_EQ(ep.finish, FinishReason::kCancelled);
  if (ep.tokens.empty()) {  // cancelled before its first token: withdrawn from the not-parked path
    EXPECT_EQ(ed.finish, FinishReason::kError);
  }
  EXPECT_TRUE(ed.tokens.empty());
  EXPECT_EQ(decode_->counts().withdrawn, 3u);
  EXPECT_EQ(decode_->counts().quarantined, 0u);
  // And a normal hand-off still works on the same connection.
  const Collected again = handed_off(prompt(20, 7), 4, 34);
  EXPECT_EQ(again.finish, FinishReason::kLength);
  expect_no_leaks();
}

// The prefill's fault policy for the decode-cancel tests: put `index` of every transfer announces itself and is
// held back for a while, so the decode side's cancel arrives before it is posted.
class HoldPut : public kestrel::disagg::testing::ScriptedFaults {
 public:
  HoldPut(size_t index, std::chrono::milliseconds delay) : index_(index) {
    puts = {{index, {kestrel::disagg::PutFault::Kind::kDelay, 0, delay}}};
  }
  kestrel::disagg::PutFault on_put(uint64_t id, size_t index, size_t length) override {
    if (index == index_) reached = true;
    return ScriptedFaults::on_put(id, index, length);
  }
  std::atomic<bool> reached{false};

 private:
  size_t index_;
};

// A cancel on the decode side alone (its client hung up; the prefill's client did not) while the transfer is
// under way: the prefill stops before its next put (put `held` of the transfer: 0 = before the first put),
// flushes what it put, ends its request cancelled and frees its pages; the decode side frees its reservation
// when the prefill confirms (not quarantined, shared memory included), and both return to zero. The deadlines
// are 10 minutes away, so only the cancel message can explain any of it: without it the prefill completes the
// transfer (kLength) and the decode side admits, then cancels.
class HandoffCancel : public HandoffFault {
 protected:
  void cancel_during_transfer(size_t held) {
    auto& hold = static_cast<HoldPut&>(*owned_faults_.emplace_back(std::make_unique<HoldPut>(held, 1500ms)));
    PrefillHandoffOptions p;
    p.destinations_timeout = p.transfer_timeout = std::chrono::minutes(10);
    p.lease = std::chrono::minutes(10);
    p.worker.faults = &hold;
    DecodeHandoffOptions d;
    d.transfer_timeout = std::chrono::minutes(10);
    open_pair(p, d);
    const std::vector<int32_t> ids = prompt(40, 3);
    Client pc, dc;
    auto did = decode_->submit(dc.make(ids, 6), 61, prefill_->instance());
    ASSERT_TRUE(did);
    ASSERT_TRUE(prefill_->submit(pc.make(ids, 6), 61));
    for (int i = 0; i < 6000 && !hold.reached; ++i) std::this_thread::sleep_for(5ms);
    ASSERT_TRUE(hold.reached) << "the transfer never started";
    decode_sched_->cancel(*did);
    decode_->cancel(*did);
    const Collected dres = dc.wait(60s), pres = pc.wait(60s);
    EXPECT_EQ(dres.finish, FinishReason::kCancelled) << dres.error;
    EXPECT_TRUE(dres.tokens.empty()) << "a token was emitted from a cancelled hand-off";
    EXPECT_EQ(pres.finish, FinishReason::kCancelled) << pres.error;
    EXPECT_EQ(pres.tokens.size(), 1u);
    EXPECT_EQ(hold.puts_seen, held + 1) << "the prefill went on putting after the cancel";
    const PrefillCounts pcnt = prefill_->counts();
    EXPECT_EQ(pcnt.cancel_messages, 1u);
    EXPECT_EQ(pcnt.cancelled, 1u);
    EXPECT_EQ(pcnt.handed_off, 0u);
    EXPECT_EQ(pcnt.failed, 0u);
    const DecodeCounts dcnt = decode_->counts();
    EXPECT_EQ(dcnt.cancelled, 1u);
    EXPECT_EQ(dcnt.cancel_confirmed, 1u);
    EXPECT_EQ(dcnt.failed, 0u);
    EXPECT_EQ(dcnt.received, 0u);
    expect_no_leaks();
    // The connection stays: a normal hand-off follows on it and equals the colocated run.
    EXPECT_TRUE(decode_->connected(prefill_->instance()));
    const std::vector<int32_t> next = prompt(20, 7);
    const Collected want = colocated(next, 4);
    const Collected again = handed_off(next, 4, 62);
    EXPECT_EQ(again.finish, FinishReason::kLength) << again.error;
    EXPECT_TRUE(bit_equal(again, want));
    expect_no_leaks();
  }
};

TEST_P(HandoffCancel, DecodeCancelBeforeTheFirstPut) { cancel_during_transfer(0); }

TEST_P(HandoffCancel, DecodeCancelMidTransfer) { cancel_during_transfer(2); }

// The decode side cancels while the prefill still computes the prompt (nothing advertised has been read yet):
// the prefill's request ends cancelled in its scheduler and the destinations are answered with a withdrawal.
TEST_P(HandoffCancel, DecodeCancelWhileThePromptRuns) {
  PrefillHandoffOptions p;
  p.destinations_timeout = p.transfer_timeout = std::chrono::minutes(10);
  DecodeHandoffOptions d;
  d.transfer_timeout = std::chrono::minutes(10);
  open_pair(p, d);
  Client pc, dc;
  auto did = decode_->submit(dc.make(prompt(300, 9), 6), 71, prefill_->instance());
  ASSERT_TRUE(did);
  for (int i = 0; i < 500 && decode_->counts().registry.in_flight == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(prefill_->submit(pc.make(prompt(300, 9), 6), 71));
  decode_sched_->cancel(*did);
  decode_->cancel(*did);
  const Collected dres = dc.wait(60s), pres = pc.wait(60s);
  EXPECT_EQ(dres.finish, FinishReason::kCancelled) << dres.error;
  EXPECT_TRUE(dres.tokens.empty());
  EXPECT_EQ(pres.finish, FinishReason::kCancelled) << pres.error;
  EXPECT_EQ(prefill_->counts().cancel_messages, 1u);
  EXPECT_EQ(prefill_->counts().handed_off, 0u);
  EXPECT_EQ(decode_->counts().cancelled, 1u);
  EXPECT_EQ(decode_->counts().quarantined, 0u);
  expect_no_leaks();
}

// The prefill's fault policy for the lease test: its first put freezes the decode side's worker (no progress, no
// heartbeats), as a decode process stopped right after it advertised its memory would be.
class FreezeDecodeOnFirstPut : public kestrel::disagg::testing::ScriptedFaults {
 public:
  explicit FreezeDecodeOnFirstPut(std::atomic<bool>& decode_stalled) : decode_stalled_(decode_stalled) {}
  kestrel::disagg::PutFault on_put(uint64_t id, size_t index, size_t length) override {
    if (index == 0) decode_stalled_ = true;
    return ScriptedFaults::on_put(id, index, length);
  }

 private:
  std::atomic<bool>& decode_stalled_;
};

// A transfer far slower than the prefill's lease to a live decode side: its heartbeats renew the lease, the
// hand-off completes and equals the colocated run. Fails if the lease ran from the start of the transfer.
TEST_P(HandoffFault, LeaseRenewedByHeartbeats) {
  faults_.puts = {{1, {kestrel::disagg::PutFault::Kind::kDelay, 0, 1500ms}}};
  PrefillHandoffOptions p;
  p.lease = 400ms;
  open_pair(p);
  const std::vector<int32_t> ids = prompt(40, 3);
  const Collected want = colocated(ids, 6);
  const Collected got = handed_off(ids, 6, 5);
  EXPECT_EQ(got.finish, FinishReason::kLength) << got.error;
  EXPECT_TRUE(bit_equal(got, want)) << "hand-off changed the generation";
  EXPECT_EQ(prefill_->counts().lease_expired, 0u);
  expect_no_leaks();
}

// The decode side freezes right after advertising. Where the flush needs the decode's acknowledgement (tcp; over
// shared memory, puts into registered heap pools, which UCX emulates with active messages: this test's pools over
// shared memory) only the lease can end the transfer (the deadlines are 10 minutes away): the prefill frees the
// pages while the decode side is still frozen and counts a lease expiry; once the decode side runs again its
// request fails cleanly (the prefill fell silent), and its memory returns as after any failure (tcp: at once;
// shared memory: it stays quarantined while the writer, this process, lives).
TEST_P(HandoffFault, FrozenDecodeLosesTheLease) {
  auto& decode_faults = static_cast<kestrel::disagg::testing::ScriptedFaults&>(
      *owned_faults_.emplace_back(std::make_unique<kestrel::disagg::testing::ScriptedFaults>()));
  auto& freeze = *owned_faults_.emplace_back(std::make_unique<FreezeDecodeOnFirstPut>(decode_faults.stalled));
  PrefillHandoffOptions p;
  p.lease = 500ms;
  p.transfer_timeout = std::chrono::minutes(10);
  p.worker.faults = &freeze;
  DecodeHandoffOptions d;
  d.transfer_timeout = std::chrono::minutes(10);
  // Longer than the freeze (the lease runs out 0.5 s after the decode side's last heartbeat): in this process the
  // stalled side's clock keeps running, which a stopped process's detector would not see.
  d.silence = 3000ms;
  d.worker.faults = &decode_faults;
  open_pair(p, d, /*ucx_pools=*/kestrel::disagg::testing::expected_transports().count("sysv") == 0);
  const std::vector<int32_t> ids = prompt(40, 3);
  Client pc, dc;
  ASSERT_TRUE(decode_->submit(dc.make(ids, 6), 5, prefill_->instance()));
  ASSERT_TRUE(prefill_->submit(pc.make(ids, 6), 5));
  const Collected pres = pc.wait(30s);
  ASSERT_TRUE(decode_faults.stalled) << "the transfer never started";
  const ServiceStats ps = settled(*prefill_sched_);
  EXPECT_EQ(ps.kv_blocks_used, 0);
  EXPECT_EQ(ps.state_slots_used, 0);
  const PrefillCounts pcnt = prefill_->counts();
  EXPECT_EQ(pcnt.in_flight, 0u);
  EXPECT_TRUE(decode_faults.stalled) << "the pages were freed only after the decode side ran again";
  EXPECT_EQ(pres.finish, FinishReason::kError);
  EXPECT_NE(pres.error.find("lease expired"), std::string::npos) << pres.error;
  EXPECT_EQ(pcnt.lease_expired, 1u);
  EXPECT_EQ(pcnt.failed, 1u);
  decode_faults.stalled = false;
  const Collected dres = dc.wait(30s);
  expect_failed_cleanly(dres, "hand-off from prefill failed", &DecodeCounts::failed_peer);
}

// Over shared memory into pools UCX allocated (the decode server's) the prefill's puts go straight into the
// decode's memory and its flush needs nothing from the decode side: frozen right after advertising, the decode
// does not hold the prefill up. The prefill hands the request off (kLength, no lease expiry) and frees its pages
// while the decode side is still frozen; once the decode side runs it reads the segment and completion messages,
// verifies every byte, and decodes exactly as a colocated run. Fails if the puts needed the decode's progress
// (the emulation): the lease would expire as in FrozenDecodeLosesTheLease.
TEST_P(HandoffFault, FrozenDecodeDoesNotHoldUpPutsIntoUcxPoolsOverSharedMemory) {
  if (kestrel::disagg::testing::expected_transports().count("sysv") == 0)
    GTEST_SKIP() << "over tcp every put needs the decode's progress (FrozenDecodeLosesTheLease)";
  auto& decode_faults = static_cast<kestrel::disagg::testing::ScriptedFaults&>(
      *owned_faults_.emplace_back(std::make_unique<kestrel::disagg::testing::ScriptedFaults>()));
  auto& freeze = *owned_faults_.emplace_back(std::make_unique<FreezeDecodeOnFirstPut>(decode_faults.stalled));
  PrefillHandoffOptions p;
  p.lease = 500ms;
  p.transfer_timeout = std::chrono::minutes(10);
  p.worker.faults = &freeze;
  DecodeHandoffOptions d;
  d.transfer_timeout = std::chrono::minutes(10);
  d.silence = 3000ms;
  d.worker.faults = &decode_faults;
  open_pair(p, d);
  const std::vector<int32_t> ids = prompt(40, 3);
  const Collected want = colocated(ids, 6);
  Client pc, dc;
  ASSERT_TRUE(decode_->submit(dc.make(ids, 6), 5, prefill_->instance()));
  ASSERT_TRUE(prefill_->submit(pc.make(ids, 6), 5));
  const Collected pres = pc.wait(30s);
  ASSERT_TRUE(decode_faults.stalled) << "the transfer never started";
  const ServiceStats ps = settled(*prefill_sched_);
  EXPECT_EQ(ps.kv_blocks_used, 0);
  EXPECT_EQ(ps.state_slots_used, 0);
  EXPECT_TRUE(decode_faults.stalled) << "the prefill waited for the decode side";
  EXPECT_EQ(pres.finish, FinishReason::kLength) << pres.error;
  EXPECT_EQ(prefill_->counts().lease_expired, 0u);
  decode_faults.stalled = false;
  const Collected got = dc.wait(30s);
  EXPECT_EQ(got.finish, FinishReason::kLength) << got.error;
  EXPECT_TRUE(bit_equal(got, want)) << "hand-off changed the generation";
  expect_no_leaks();
}

// Allocation wait: a decode side that reserves the request's memory only after the prefill gave up waiting for
// destinations gets a withdrawal at once (its memory back, not quarantined), not a wait for its own deadline.
TEST_P(HandoffFault, LateReservationIsWithdrawn) {
  PrefillHandoffOptions p;
  p.destinations_timeout = 300ms;
  DecodeHandoffOptions d;
  d.transfer_timeout = std::chrono::minutes(10);
  open_pair(p, d);
  Client pc;
  ASSERT_TRUE(prefill_->submit(pc.make(prompt(30, 8), 4), 41));
  const Collected pres = pc.wait(30s);
  EXPECT_EQ(pres.finish, FinishReason::kError);
  EXPECT_NE(pres.error.find("no destinations"), std::string::npos) << pres.error;
  Client dc;
  ASSERT_TRUE(decode_->submit(dc.make(prompt(30, 8), 4), 41, prefill_->instance()));
  const Collected dres = dc.wait(30s);
  EXPECT_EQ(dres.finish, FinishReason::kError);
  EXPECT_NE(dres.error.find("ended the request before its hand-off"), std::string::npos) << dres.error;
  EXPECT_TRUE(dres.tokens.empty());
  EXPECT_EQ(decode_->counts().withdrawn, 1u);
  EXPECT_EQ(prefill_->counts().withdrawn, 1u);
  EXPECT_EQ(prefill_->counts().no_destinations, 1u);
  EXPECT_TRUE(decode_->connected(prefill_->instance()));
  expect_no_leaks();
}

std::string name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, Handoff,
                         ::testing::Values("k3-tiny", "k3-tiny-dsa", "deepseek-v3-tiny", "qwen3moe-micro-bf16"), name);
INSTANTIATE_TEST_SUITE_P(Models, HandoffFault, ::testing::Values("k3-tiny"), name);
INSTANTIATE_TEST_SUITE_P(Models, HandoffCancel, ::testing::Values("k3-tiny"), name);

}  // namespace
}  // namespace kestrel::pd
