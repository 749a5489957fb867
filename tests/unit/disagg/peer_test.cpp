// disagg/ across two processes: this test is the decode side, disagg_peer (a child process) the prefill side. By
// worker address when UCX_TLS names shared memory only, else by sockaddr (the child listens on loopback TCP).
// A transfer of scattered ranges lands and verifies; a peer frozen by SIGSTOP and a peer killed with SIGKILL
// fail the transfer within bounds (UCX's endpoint error on tcp, heartbeat silence on shared memory); quarantined
// memory is released only once the peer can no longer write; the registry ends with nothing held. Over shared
// memory, a peer that owns a UCX-allocated region and dies before its remote key is unpacked here never crashes
// this side (UCX 1.13's unpack error path does): its System V segment is attached here first (PeerSegments).
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
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

// The System V segments of at least `min_bytes` mapped into a process (shmid: the inode column of /proc/PID/maps).
std::set<int> sysv_segments(pid_t pid, size_t min_bytes) {
  std::set<int> ids;
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(f, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, path;
    long long inode = -1;
    if (!(fields >> range >> perms >> offset >> dev >> inode >> path) || path.rfind("/SYSV", 0) != 0) continue;
    const size_t dash = range.find('-');
    const size_t bytes = std::stoull(range.substr(dash + 1), nullptr, 16) - std::stoull(range.substr(0, dash), nullptr, 16);
    if (bytes >= min_bytes) ids.insert(static_cast<int>(inode));
  }
  return ids;
}

bool segment_exists(int shmid) {
  shmid_ds info{};
  return shmctl(shmid, IPC_STAT, &info) == 0;
}

// Kills the child with SIGKILL and reaps it right before UCX unpacks its key: after the liveness check passed.
class KillBeforeUnpack : public FaultPolicy {
 public:
  explicit KillBeforeUnpack(Child& child) : child_(child) {}
  PutFault on_put(uint64_t, size_t, size_t) override { return {}; }
  bool drop_message(uint16_t) override { return false; }
  bool stall_progress() override { return false; }
  void before_rkey_unpack() override {
    ++calls;
    if (child_.pid > 0 && kill(child_.pid, SIGKILL) == 0) status = child_.reap(milliseconds(5000));
  }
  int calls = 0;
  int status = -1;

 private:
  Child& child_;
};

class DisaggPeer : public ::testing::Test {
 protected:
  // The test's pool: 32 KiB of heap memory with four small scattered ranges, unless `layout` names others (then
  // the pool is allocated through UCX, as a decode's pools are, with `bytes` bytes).
  void start(const std::string& behaviour, std::vector<std::pair<size_t, size_t>> layout = {}, size_t bytes = 0) {
    WorkerOptions options;
    options.faults = faults.get();
    worker = std::move(Worker::create(options).value());
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
    if (layout.empty()) {
      pool.assign(32 * 1024, std::byte{0xee});
      region = std::move(Region::map(*worker, pool.data(), pool.size()).value());
      mem = pool.data();
      layout = {{20000, 3000}, {64, 1000}, {5000, 1}, {9000, 7777}};
    } else {
      auto r = Region::allocate(worker->shared_context(), bytes);
      ASSERT_TRUE(r) << r.error().message();
      region = std::move(*r);
      mem = region->base();
      std::fill(mem, mem + bytes, std::byte{0xee});
    }
    for (auto [off, len] : layout) ranges.push_back({region.get(), off, len});
  }

  bool landed() const {
    for (size_t i = 0; i < ranges.size(); ++i) {
      for (size_t j = 0; j < ranges[i].length; ++j) {
        if (mem[ranges[i].offset + j] != static_cast<std::byte>((7 * i + 13 * j + 1) % 256)) return false;
      }
    }
    return true;
  }

  void expect_nothing_held() {
    RegistryCounts c = registry.counts();
    EXPECT_EQ(c.in_flight, 0u);
    EXPECT_EQ(c.quarantined, 0u);
    EXPECT_EQ(c.held_ranges, 0u);
    for (const DestinationRange& r : ranges) EXPECT_FALSE(registry.held(mem + r.offset, r.length));
  }

  void TearDown() override {
    if (ep) (void)ep->close(Deadline::after(milliseconds(2000)));
    region.reset();
    ep.reset();
    worker.reset();
  }

  // The owner's packed key ("key <hex>" from disagg_peer own), once its pid is known here (its first heartbeat).
  std::vector<std::byte> owners_key() {
    std::istringstream line(child.line(milliseconds(10000)));
    std::string word, hex;
    EXPECT_TRUE(line >> word >> hex && word == "key") << "no key from disagg_peer";
    Deadline d = Deadline::after(milliseconds(10000));
    while (!worker->pid_of(ep->peer().value()) && !d.expired()) worker->progress();
    EXPECT_EQ(worker->pid_of(ep->peer().value()), std::optional<uint32_t>(static_cast<uint32_t>(child.pid)));
    return from_hex(hex);
  }

  Child child;
  std::unique_ptr<KillBeforeUnpack> faults;  // set before start(); outlives the worker
  std::unique_ptr<Worker> worker;
  std::unique_ptr<Endpoint> ep;
  std::vector<std::byte> pool;
  std::byte* mem = nullptr;  // the pool's bytes: `pool` or UCX-allocated
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

// 64 MiB in two ranges between two processes, into UCX-allocated memory (over shared memory the put lanes write
// into it directly): puts, flush and the completion, every byte verified, the bytes around the ranges untouched.
TEST_F(DisaggPeer, SixtyFourMiBBetweenProcessesLandsBitExact) {
  constexpr size_t kMiB = size_t{1} << 20, kGap = 4096;
  ASSERT_NO_FATAL_FAILURE(start("normal", {{kGap, 40 * kMiB}, {40 * kMiB + 2 * kGap, 24 * kMiB}}, 64 * kMiB + 3 * kGap));
  size_t total = 0;
  for (const DestinationRange& r : ranges) total += r.length;
  ASSERT_EQ(total, 64 * kMiB);
  IncomingTransfer in(kTransfer, *ep, registry, ranges);
  ASSERT_TRUE(in.advertise(Deadline::after(milliseconds(5000))).is_ok());
  Status st = in.wait(Deadline::after(milliseconds(30000)), kSilence);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(in.state(), TransferState::kCompleted);
  EXPECT_TRUE(landed());
  for (size_t at : {size_t{0}, kGap - 1, 40 * kMiB + kGap, 40 * kMiB + 2 * kGap - 1, 64 * kMiB + 2 * kGap})
    EXPECT_EQ(mem[at], std::byte{0xee}) << "byte " << at << " outside the ranges was written";
  testing::expect_transports(*ep);
  if (by_address()) {
    // Shared memory: the lanes are the segment-writing transports, not active-message emulation over another.
    for (const std::string& t : ep->transports()) EXPECT_TRUE(t == "sysv" || t == "posix" || t == "cma") << t;
  }
  EXPECT_EQ(registry.counts().completed, 1u);
  expect_nothing_held();
  EXPECT_TRUE(ep->close(Deadline::after(milliseconds(2000))).is_ok());
  int status = child.reap(milliseconds(10000));
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

// The window the liveness check leaves: the owner of a shared-memory region dies after the check and before UCX
// attaches its segment. Without the segment attached here first, the segment is gone when UCX attaches it and
// UCX 1.13's unpack error path crashes this process (SIGSEGV). With it, the unpack succeeds into the orphaned
// segment, which lives until the endpoint closes and is removed then: nothing is left behind.
TEST_F(DisaggPeer, OwnerKilledRightAfterTheLivenessCheckLeavesItsSegmentUntilTheClose) {
  if (!by_address()) GTEST_SKIP() << "over tcp a remote key maps nothing: no segment to lose";
  faults = std::make_unique<KillBeforeUnpack>(child);
  KillBeforeUnpack& kill_owner = *faults;
  ASSERT_NO_FATAL_FAILURE(start("own"));
  const std::vector<std::byte> key = owners_key();
  const std::set<int> pools = sysv_segments(child.pid, size_t{8} << 20);
  ASSERT_EQ(pools.size(), 1u) << "the owner's 8 MiB region is not one System V segment";
  const int pool = *pools.begin();

  Result<const RemoteKey*> k = ep->cached_rkey(key);
  ASSERT_EQ(kill_owner.calls, 1);
  ASSERT_NE(kill_owner.status, -1) << "the owner was not reaped before the unpack";
  EXPECT_TRUE(WIFSIGNALED(kill_owner.status) && WTERMSIG(kill_owner.status) == SIGKILL);
  ASSERT_TRUE(k) << k.error().message();
  EXPECT_TRUE(segment_exists(pool));  // the owner is gone; the attachment here keeps the segment

  ASSERT_TRUE(ep->close(Deadline::after(milliseconds(2000))).is_ok() || ep->closed());
  ASSERT_TRUE(ep->closed());
  EXPECT_FALSE(segment_exists(pool)) << "the dead owner's segment outlived the endpoint";
}

// The owner already gone when its key is to be unpacked: refused without asking UCX, and nothing attached.
TEST_F(DisaggPeer, OwnerGoneBeforeTheUnpackIsRefused) {
  if (!by_address()) GTEST_SKIP() << "over tcp a remote key maps nothing: no segment to lose";
  ASSERT_NO_FATAL_FAILURE(start("own"));
  const std::vector<std::byte> key = owners_key();
  const std::set<int> pools = sysv_segments(child.pid, size_t{8} << 20);
  ASSERT_EQ(pools.size(), 1u);
  ASSERT_EQ(kill(child.pid, SIGKILL), 0);
  ASSERT_NE(child.reap(milliseconds(5000)), -1);
  EXPECT_FALSE(segment_exists(*pools.begin()));

  Result<const RemoteKey*> k = ep->cached_rkey(key);
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(k.error().message().find("has exited or is exiting"), std::string::npos) << k.error().message();
  Result<const RemoteKey*> again = ep->cached_rkey(key);  // not tried again
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().message(), k.error().message());
}

}  // namespace
}  // namespace kestrel::disagg
