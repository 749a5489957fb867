// The hand-off between two processes: this test is the decode side (scheduler + DecodeHandoff on its own engine),
// pd_peer (a child process) the prefill side, both loading the same tiny K3 checkpoint, connected over the
// transports UCX_TLS selects (ctest: shm and tcp), the lanes checked.
//   - Parity: decoding after the hand-off equals a colocated run in this process bit for bit.
//   - A prefill killed (SIGKILL) in the middle of a transfer fails the request with a clear error, without a hang;
//     once the dead peer can no longer write (tcp: connection closed; shared memory: also its process reaped)
//     every reserved page and slot is back and no transfer is held.
#include <gtest/gtest.h>

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

  // Starts pd_peer (with a put delay when given) and connects both ways.
  void start(int put_delay_ms = -1) {
    std::vector<std::string> args = {KESTREL_PD_PEER, dir_->path()};
    if (put_delay_ms >= 0) args.push_back(std::to_string(put_delay_ms));
    ASSERT_NO_FATAL_FAILURE(child_.spawn(args));
    std::istringstream hello(child_.line(30000ms));
    uint32_t pid = 0;
    std::string address;
    ASSERT_TRUE(hello >> peer_ >> pid >> address) << "no greeting from pd_peer";
    EXPECT_EQ(pid, static_cast<uint32_t>(child_.pid));
    auto s = Scheduler::create(*engine_, config());
    ASSERT_TRUE(s) << s.error().message();
    sched_ = std::move(*s);
    auto d = DecodeHandoff::create(*sched_, {});
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
    EXPECT_EQ(child_.line(10000ms), "done " + std::to_string(room) + " length");
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
  ASSERT_NO_FATAL_FAILURE(start(5000));  // the second range of every transfer waits 5 s: killed in between
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

}  // namespace
}  // namespace kestrel::pd
