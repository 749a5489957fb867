// disagg/ across two processes: this test is the decode side, disagg_peer (a child process) the prefill side. By
// worker address when UCX_TLS names shared memory only, else by sockaddr (the child listens on loopback TCP).
// A transfer of scattered ranges lands and verifies; a peer frozen by SIGSTOP and a peer killed with SIGKILL
// fail the transfer within bounds (UCX's endpoint error on tcp, heartbeat silence on shared memory); quarantined
// memory is released only once the peer can no longer write; the registry ends with nothing held.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <sstream>
#include <string>

#include "disagg/region_registry.h"
#include "disagg/transfer.h"
#include "child.h"
#include "hex.h"
#include "pair.h"

namespace kestrel::disagg {
namespace {

using std::chrono::milliseconds;
using testing::Child;
using testing::from_hex;
using testing::to_hex;

constexpr uint64_t kTransfer = 0x7e57;
constexpr milliseconds kSilence(1000);

bool by_address() {
  std::set<std::string> t = testing::expected_transports();
  return !t.empty() && t.count("tcp") == 0;
}

class DisaggPeer : public ::testing::Test {
 protected:
  void start(const std::string& behaviour) {
    worker = std::move(Worker::create({}).value());
    ASSERT_NO_FATAL_FAILURE(child.spawn({KESTREL_DISAGG_PEER, by_address() ? "address" : "sockaddr", behaviour,
                                         std::to_string(kTransfer)}));
    std::istringstream hello(child.line(milliseconds(10000)));
    uint64_t instance = 0;
    uint32_t pid = 0;
    std::string where;
    ASSERT_TRUE(hello >> instance >> pid >> where) << "no greeting from disagg_peer";
    EXPECT_EQ(pid, static_cast<uint32_t>(child.pid));
    if (by_address()) {
      child.write_line(to_hex(worker->address().value()));
      auto e = Endpoint::connect_address(*worker, from_hex(where));
      ASSERT_TRUE(e) << e.error().message();
      ep = std::move(*e);
    } else {
      auto e = Endpoint::connect_sockaddr(*worker, "127.0.0.1", static_cast<uint16_t>(std::stoi(where)));
      ASSERT_TRUE(e) << e.error().message();
      ep = std::move(*e);
    }
    ep->set_peer(instance);
    pool.assign(32 * 1024, std::byte{0xee});
    region = std::move(Region::map(*worker, pool.data(), pool.size()).value());
    const std::pair<size_t, size_t> layout[] = {{20000, 3000}, {64, 1000}, {5000, 1}, {9000, 7777}};
    for (auto [off, len] : layout) ranges.push_back({region.get(), off, len});
  }

  bool landed() const {
    for (size_t i = 0; i < ranges.size(); ++i) {
      for (size_t j = 0; j < ranges[i].length; ++j) {
        if (pool[ranges[i].offset + j] != static_cast<std::byte>((7 * i + 13 * j + 1) % 256)) return false;
      }
    }
    return true;
  }

  void expect_nothing_held() {
    RegistryCounts c = registry.counts();
    EXPECT_EQ(c.in_flight, 0u);
    EXPECT_EQ(c.quarantined, 0u);
    EXPECT_EQ(c.held_ranges, 0u);
    for (const DestinationRange& r : ranges) EXPECT_FALSE(registry.held(pool.data() + r.offset, r.length));
  }

  void TearDown() override {
    if (ep) (void)ep->close(Deadline::after(milliseconds(2000)));
    region.reset();
    ep.reset();
    worker.reset();
  }

  Child child;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<Endpoint> ep;
  std::vector<std::byte> pool;
  std::unique_ptr<Region> region;
  std::vector<DestinationRange> ranges;
  RegionRegistry registry;
};

TEST_F(DisaggPeer, TransferBetweenProcessesLandsAndVerifies) {
  ASSERT_NO_FATAL_FAILURE(start("normal"));
  IncomingTransfer in(kTransfer, *ep, registry, ranges);
  ASSERT_TRUE(in.advertise(Deadline::after(milliseconds(5000))).is_ok());
  Status st = in.wait(Deadline::after(milliseconds(5000)), kSilence);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(in.state(), TransferState::kCompleted);
  EXPECT_TRUE(landed());
  EXPECT_EQ(pool[0], std::byte{0xee});  // outside the ranges: untouched
  testing::expect_transports(*ep);
  EXPECT_EQ(registry.counts().completed, 1u);
  expect_nothing_held();
  EXPECT_TRUE(ep->close(Deadline::after(milliseconds(2000))).is_ok());
  int status = child.reap(milliseconds(5000));
  ASSERT_NE(status, -1) << "disagg_peer did not exit";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(DisaggPeer, FrozenPeerFailsWithinTheSilenceLimit) {
  ASSERT_NO_FATAL_FAILURE(start("stop"));
  IncomingTransfer in(kTransfer, *ep, registry, ranges);
  ASSERT_TRUE(in.advertise(Deadline::after(milliseconds(5000))).is_ok());
  auto start_wait = Clock::now();
  Status st = in.wait(Deadline::after(milliseconds(10000)), kSilence);
  auto took = Clock::now() - start_wait;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
  EXPECT_NE(st.message().find("silent"), std::string::npos) << st.message();
  EXPECT_LT(took, kSilence + milliseconds(1500));
  EXPECT_EQ(in.state(), TransferState::kFailed);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid, &status, WNOHANG | WUNTRACED), child.pid);
  EXPECT_TRUE(WIFSTOPPED(status));  // it really was frozen, not dead
  EXPECT_EQ(registry.counts().quarantined, 1u);

  (void)ep->close(Deadline::after(milliseconds(2000)));
  ASSERT_TRUE(ep->closed());
  if (worker->peer_failure() == PeerFailure::kUcx) {
    // tcp: its connection is gone; even if it wakes up it cannot write any more.
    EXPECT_TRUE(registry.release_closed(*ep).is_ok());
  } else {
    // Shared memory: a stopped process may continue and write directly: held until it is gone.
    EXPECT_EQ(registry.release_closed(*ep).code(), StatusCode::kUnavailable);
    EXPECT_EQ(registry.counts().quarantined, 1u);
    kill(child.pid, SIGKILL);
    ASSERT_NE(child.reap(milliseconds(5000)), -1);
    EXPECT_TRUE(registry.release_closed(*ep).is_ok());
  }
  EXPECT_EQ(registry.counts().released_after_close, 1u);
  expect_nothing_held();
}

TEST_F(DisaggPeer, KilledPeerFailsTheTransferAndIsReleasedAfterClose) {
  ASSERT_NO_FATAL_FAILURE(start("hold"));
  IncomingTransfer in(kTransfer, *ep, registry, ranges);
  ASSERT_TRUE(in.advertise(Deadline::after(milliseconds(5000))).is_ok());
  // Progress until the child says it holds the destinations (its line comes over the pipe).
  std::string held;
  Deadline d = Deadline::after(milliseconds(10000));
  while (held.empty() && !d.expired()) {
    worker->progress();
    held = child.line(milliseconds(1));
  }
  ASSERT_EQ(held, "held");
  ASSERT_EQ(kill(child.pid, SIGKILL), 0);
  auto start_wait = Clock::now();
  Status st = in.wait(Deadline::after(milliseconds(10000)), kSilence);
  auto took = Clock::now() - start_wait;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
  if (worker->peer_failure() == PeerFailure::kUcx) {
    // tcp: UCX reports the endpoint error (connection reset) well before the silence limit.
    EXPECT_NE(st.message().find("endpoint to peer"), std::string::npos) << st.message();
    EXPECT_LT(took, kSilence);
  } else {
    EXPECT_NE(st.message().find("silent"), std::string::npos) << st.message();
    EXPECT_LT(took, kSilence + milliseconds(1500));
  }
  EXPECT_TRUE(ep->failed());
  EXPECT_EQ(registry.counts().quarantined, 1u);
  EXPECT_EQ(registry.release_closed(*ep).code(), StatusCode::kUnavailable);  // not before the close
  EXPECT_EQ(registry.counts().quarantined, 1u);
  int status = child.reap(milliseconds(5000));
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  (void)ep->close(Deadline::after(milliseconds(2000)));
  ASSERT_TRUE(ep->closed());
  EXPECT_FALSE(ep->peer_may_write());
  EXPECT_TRUE(registry.release_closed(*ep).is_ok());
  expect_nothing_held();
}

}  // namespace
}  // namespace kestrel::disagg
