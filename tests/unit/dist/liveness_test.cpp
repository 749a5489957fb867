// The cell's liveness watchdog (dist/liveness.h): the decisions with time passed in (LivenessTracker), then the
// heartbeats over real loopback TCP between ranks as threads (the in-process communicator carries the one
// startup broadcast). Waits in the socket tests are for an event, capped far above the windows used; nothing
// asserts how fast an event comes.
#include "dist/liveness.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "dist/fake_communicator.h"

namespace kestrel::dist {
namespace {

using Clock = LivenessTracker::Clock;
using std::chrono::milliseconds;

LivenessOptions opts(int window_ms, int deadline_ms) {
  LivenessOptions o;
  o.window = milliseconds(window_ms);
  o.deadline = milliseconds(deadline_ms);
  o.connect_timeout = milliseconds(20000);
  return o;
}

TEST(LivenessTracker, HealthyWhileEveryPeerIsHeardWithinTheWindow) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1, 2}, opts(1000, 5000), t0);
  EXPECT_TRUE(t.check(t0).healthy);
  t.heard(1, t0 + milliseconds(900));
  t.heard(2, t0 + milliseconds(900));
  const auto v = t.check(t0 + milliseconds(1899));
  EXPECT_TRUE(v.healthy);
  EXPECT_EQ(v.rank, -1);
  EXPECT_TRUE(v.why.empty());
  EXPECT_FALSE(v.deadline_passed);
}

TEST(LivenessTracker, SilentPeerIsUnhealthyAtTheWindowAndNamed) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1, 2}, opts(1000, 5000), t0);
  t.heard(1, t0 + milliseconds(500));
  t.heard(2, t0 + milliseconds(800));
  EXPECT_TRUE(t.check(t0 + milliseconds(1499)).healthy);
  const auto v = t.check(t0 + milliseconds(1500));
  EXPECT_FALSE(v.healthy);
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(v.why, "rank 1 sent no heartbeat for 1000 ms (frozen, overloaded or unreachable)");
  EXPECT_FALSE(v.deadline_passed);
}

TEST(LivenessTracker, HeardAgainIsHealthyAgain) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1}, opts(1000, 5000), t0);
  EXPECT_FALSE(t.check(t0 + milliseconds(2000)).healthy);
  t.heard(1, t0 + milliseconds(2100));
  EXPECT_TRUE(t.check(t0 + milliseconds(2200)).healthy);
  // A late-delivered older beat does not move the last-heard time back.
  t.heard(1, t0 + milliseconds(100));
  EXPECT_TRUE(t.check(t0 + milliseconds(3000)).healthy);
}

TEST(LivenessTracker, DeadlineOfTheLongestSilentPeer) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1, 2, 3}, opts(1000, 5000), t0);
  t.heard(1, t0 + milliseconds(3000));
  t.heard(3, t0 + milliseconds(3000));
  auto v = t.check(t0 + milliseconds(4999));
  EXPECT_EQ(v.rank, 2);
  EXPECT_FALSE(v.deadline_passed);
  v = t.check(t0 + milliseconds(5000));
  EXPECT_EQ(v.rank, 2);
  EXPECT_TRUE(v.deadline_passed);
}

TEST(LivenessTracker, LostPeerIsUnhealthyAtOnceForGoodAndNamedFirst) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1, 2}, opts(1000, 5000), t0);
  t.heard(1, t0 + milliseconds(900));
  t.heard(2, t0 + milliseconds(100));
  t.lost(1, t0 + milliseconds(950));
  auto v = t.check(t0 + milliseconds(1000));
  EXPECT_FALSE(v.healthy);
  EXPECT_EQ(v.rank, 1);  // rank 2 was silent longer, but a closed connection is the surer failure
  EXPECT_EQ(v.why, "rank 1 closed its liveness connection (its process is gone); last heard 100 ms ago");
  t.heard(1, t0 + milliseconds(1100));  // nothing revives a lost peer
  v = t.check(t0 + milliseconds(1200));
  EXPECT_FALSE(v.healthy);
  EXPECT_EQ(v.rank, 1);
  EXPECT_FALSE(v.deadline_passed);
  EXPECT_TRUE(t.check(t0 + milliseconds(5900)).deadline_passed);  // 5 s after rank 1 was last heard
}

TEST(LivenessTracker, NextChangeIsTheFirstWindowOrDeadlineToRunOut) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1, 2}, opts(1000, 5000), t0);
  t.heard(1, t0 + milliseconds(300));
  t.heard(2, t0 + milliseconds(100));
  EXPECT_EQ(t.next_change(t0 + milliseconds(500)), t0 + milliseconds(1100));   // rank 2's window
  EXPECT_EQ(t.next_change(t0 + milliseconds(1100)), t0 + milliseconds(1300));  // then rank 1's
  EXPECT_EQ(t.next_change(t0 + milliseconds(1300)), t0 + milliseconds(5100));  // then rank 2's deadline
  t.lost(1, t0 + milliseconds(400));
  EXPECT_EQ(t.next_change(t0 + milliseconds(500)), t0 + milliseconds(1100));  // a lost peer has no window left
  EXPECT_EQ(t.next_change(t0 + milliseconds(5100)), t0 + milliseconds(5300));  // but its deadline
  EXPECT_EQ(t.next_change(t0 + milliseconds(5300)), Clock::time_point::max());
}

TEST(LivenessTracker, UnknownRanksAreIgnored) {
  const auto t0 = Clock::time_point{};
  LivenessTracker t({1}, opts(1000, 5000), t0);
  t.heard(7, t0 + milliseconds(900));
  t.lost(7, t0 + milliseconds(900));
  EXPECT_TRUE(t.check(t0 + milliseconds(999)).healthy);
  EXPECT_EQ(t.check(t0 + milliseconds(1000)).rank, 1);
}

// Events one rank's Liveness reported, in order, waited on with a cap.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> events;  // "unhealthy: <why>", "healthy", "deadline: <why>"

  Liveness::Events sink() {
    auto add = [this](std::string e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
      cv.notify_all();
    };
    return {[add](const std::string& w) { add("unhealthy: " + w); }, [add](const std::string&) { add("healthy"); },
            [add](const std::string& w) { add("deadline: " + w); }};
  }
  // True once an event starting with `prefix` was reported (within 20 s).
  bool wait_for(const std::string& prefix) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] {
      for (const auto& e : events)
        if (e.rfind(prefix, 0) == 0) return true;
      return false;
    });
  }
  std::vector<std::string> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
};

FakeHub::Options hub_options() { return {.timeout = milliseconds(60000)}; }

TEST(Liveness, RejectsADeadlineShorterThanTheWindow) {
  run_fake_ranks(1, [](Communicator& comm) {
    EXPECT_FALSE(Liveness::open(comm, opts(1000, 999)).has_value());
    EXPECT_FALSE(Liveness::open(comm, opts(0, 10)).has_value());
  });
}

TEST(Liveness, DeadRankIsReportedByNameAtOnceThenTheDeadline) {
  Seen seen;
  run_fake_ranks(
      3,
      [&](Communicator& comm) {
        auto l = Liveness::open(comm, opts(200, 600));
        ASSERT_TRUE(l.has_value()) << l.error().message();
        (*l)->start(comm.rank() == 0 ? seen.sink() : Liveness::Events{});
        ASSERT_TRUE(comm.barrier().is_ok());  // every rank beating
        if (comm.rank() == 2) l->reset();     // rank 2 "dies": its socket closes
        ASSERT_TRUE(comm.barrier().is_ok());
        if (comm.rank() == 0) {
          ASSERT_TRUE(seen.wait_for("unhealthy: rank 2 closed its liveness connection")) << seen.snapshot().size();
          EXPECT_NE((*l)->unhealthy().find("rank 2 closed"), std::string::npos);
          ASSERT_TRUE(seen.wait_for("deadline: rank 2 closed"));
          EXPECT_EQ(seen.snapshot().front().rfind("unhealthy: rank 2", 0), 0u);  // never rank 1, which beats
        }
        ASSERT_TRUE(comm.barrier().is_ok());
      },
      hub_options());
}

TEST(Liveness, FrozenRankIsUnhealthyAfterTheWindowThenTheDeadline) {
  Seen seen;
  run_fake_ranks(
      3,
      [&](Communicator& comm) {
        auto l = Liveness::open(comm, opts(200, 600));
        ASSERT_TRUE(l.has_value()) << l.error().message();
        // Rank 1 keeps its connection open but never beats (a stopped process).
        if (comm.rank() != 1) (*l)->start(comm.rank() == 0 ? seen.sink() : Liveness::Events{});
        if (comm.rank() == 0) {
          ASSERT_TRUE(seen.wait_for("unhealthy: rank 1 sent no heartbeat for"));
          ASSERT_TRUE(seen.wait_for("deadline: rank 1 sent no heartbeat for"));
          for (const auto& e : seen.snapshot()) EXPECT_EQ(e.find("rank 2"), std::string::npos) << e;
        }
        ASSERT_TRUE(comm.barrier().is_ok());
      },
      hub_options());
}

TEST(Liveness, FollowerWatchesRankZero) {
  Seen seen;
  run_fake_ranks(
      2,
      [&](Communicator& comm) {
        auto l = Liveness::open(comm, opts(200, 600));
        ASSERT_TRUE(l.has_value()) << l.error().message();
        if (comm.rank() == 1) {  // rank 0 never beats
          (*l)->start(seen.sink());
          ASSERT_TRUE(seen.wait_for("deadline: rank 0 sent no heartbeat for"));
        }
        ASSERT_TRUE(comm.barrier().is_ok());
      },
      hub_options());
}

TEST(Liveness, RecoversWhenAFrozenRankBeatsAgainAndStaysQuietAfterExpectExit) {
  Seen seen;
  run_fake_ranks(
      2,
      [&](Communicator& comm) {
        auto l = Liveness::open(comm, opts(200, 60000));
        ASSERT_TRUE(l.has_value()) << l.error().message();
        if (comm.rank() == 0) {
          (*l)->start(seen.sink());
          ASSERT_TRUE(seen.wait_for("unhealthy: rank 1 sent no heartbeat"));
        }
        ASSERT_TRUE(comm.barrier().is_ok());
        if (comm.rank() == 1) (*l)->start({});  // rank 1 "resumes"
        if (comm.rank() == 0) {
          ASSERT_TRUE(seen.wait_for("healthy"));
          EXPECT_TRUE((*l)->unhealthy().empty());
          (*l)->expect_exit();
        }
        ASSERT_TRUE(comm.barrier().is_ok());
        if (comm.rank() == 1) l->reset();  // a planned stop: rank 0 says nothing more
        ASSERT_TRUE(comm.barrier().is_ok());
        if (comm.rank() == 0) {
          // The loss is still visible to unhealthy() (it is true), but no event is reported.
          for (int i = 0; i < 2000 && (*l)->unhealthy().empty(); ++i) std::this_thread::sleep_for(milliseconds(10));
          EXPECT_NE((*l)->unhealthy().find("rank 1 closed"), std::string::npos);
          const auto events = seen.snapshot();
          ASSERT_EQ(events.size(), 2u);
          EXPECT_EQ(events[1], "healthy");
        }
      },
      hub_options());
}

}  // namespace
}  // namespace kestrel::dist
