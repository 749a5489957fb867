// disagg/ in one process: a decode worker and a prefill worker exchange a transfer of scattered ranges over the
// transports UCX_TLS selects (ctest runs this binary once with UCX_TLS=shm and once with UCX_TLS=tcp), connected
// by worker address and by a listener's sockaddr; and every fault of the transport's fault policy ends in a failed
// transfer whose memory stays quarantined until its endpoint is closed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <numeric>
#include <optional>
#include <thread>

#include "disagg/checksum.h"
#include "disagg/memory.h"
#include "disagg/put.h"
#include "disagg/region_registry.h"
#include "disagg/transfer.h"
#include "pair.h"

namespace kestrel::disagg {
namespace {

using std::chrono::milliseconds;
using testing::ScriptedFaults;

constexpr size_t kPoolBytes = 64 * 1024;
constexpr uint64_t kTransfer = 0x5eed;

// Two workers (decode, prefill) connected to each other, decode's pool registered once, prefill's sources filled
// with a pattern, decode's pool with another.
class DisaggPair : public ::testing::Test {
 public:
  void connect(bool by_sockaddr) {
    WorkerOptions d, p;
    d.instance = 11;
    p.instance = 22;
    p.faults = &faults;
    p.message_ttl = prefill_ttl;
    decode = std::move(Worker::create(d).value());
    prefill = std::move(Worker::create(p).value());
    if (by_sockaddr) {
      auto listener = Listener::create(*prefill, "127.0.0.1", 0);
      ASSERT_TRUE(listener) << listener.error().message();
      auto client = Endpoint::connect_sockaddr(*decode, "127.0.0.1", (*listener)->port());
      ASSERT_TRUE(client) << client.error().message();
      to_prefill = std::move(*client);
      // The decode worker must progress too for the connection to complete: accept with both progressing.
      Result<std::unique_ptr<Endpoint>> server = unavailable("not accepted");
      Deadline deadline = Deadline::after(milliseconds(5000));
      while (!deadline.expired()) {
        decode->progress();
        server = (*listener)->accept(Deadline::after(milliseconds(1)));
        if (server) break;
      }
      ASSERT_TRUE(server) << server.error().message();
      to_decode = std::move(*server);
    } else {
      to_prefill = std::move(Endpoint::connect_address(*decode, prefill->address().value()).value());
      to_decode = std::move(Endpoint::connect_address(*prefill, decode->address().value()).value());
    }
    to_prefill->set_peer(prefill->instance());
    to_decode->set_peer(decode->instance());
    pool.assign(kPoolBytes, std::byte{0xee});
    region = std::move(Region::map(*decode, pool.data(), pool.size()).value());
    source.resize(kPoolBytes);
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  }

  // Scattered ranges of different sizes and out of order in the pool: (offset, length), and the matching sources
  // (taken from the same offsets of `source`).
  std::vector<DestinationRange> destinations() const {
    const std::pair<size_t, size_t> layout[] = {{40960, 4096}, {0, 512}, {8192, 1}, {12288, 8000}, {30000, 77}};
    std::vector<DestinationRange> out;
    for (auto [off, len] : layout) out.push_back({region.get(), off, len});
    return out;
  }
  std::vector<std::span<const std::byte>> sources() const {
    std::vector<std::span<const std::byte>> out;
    for (const DestinationRange& d : destinations()) out.push_back({source.data() + d.offset, d.length});
    return out;
  }

  // Runs the prefill side in its own thread (each worker is driven by one thread, as in two processes): it waits
  // for the destinations, runs the transfer with `prefill_sources` (default: sources()), then keeps progressing
  // (heartbeats, the decode side's connection needs) until the decode side is done. Decode runs here.
  struct Outcome {
    Status prefill, decode;
  };
  Outcome run(milliseconds decode_deadline = milliseconds(3000), milliseconds silence = milliseconds(2000),
              std::optional<std::vector<std::span<const std::byte>>> prefill_sources = std::nullopt) {
    Outcome o;
    std::atomic<bool> stop{false}, prefill_done{false};
    std::thread side([&] {
      uint64_t sender = 0;
      Result<Destinations> dst = wait_destinations(*prefill, kTransfer, Deadline::after(milliseconds(2000)), &sender);
      if (!dst) {
        o.prefill = dst.error();
      } else {
        EXPECT_EQ(sender, decode->instance());
        OutgoingTransfer out(kTransfer, *to_decode, std::move(*dst), prefill_sources ? *prefill_sources : sources(),
                             segment_bytes);
        o.prefill = out.run(Deadline::after(milliseconds(2000)));
        EXPECT_EQ(out.state(), o.prefill.is_ok() ? TransferState::kCompleted : TransferState::kFailed);
      }
      prefill_done = true;
      while (!stop) {
        if (!prefill->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    IncomingTransfer in(kTransfer, *to_prefill, registry, destinations());
    o.decode = in.advertise(Deadline::after(milliseconds(2000)));
    if (o.decode.is_ok()) {
      o.decode = in.wait(Deadline::after(decode_deadline), silence);
      EXPECT_EQ(in.state(), o.decode.is_ok() ? TransferState::kCompleted : TransferState::kFailed);
    }
    // The decode side keeps progressing until the prefill's run ends, as a decode server's thread does: over tcp
    // the prefill's flush needs the target's progress, also after the decode gave the transfer up (a checksum
    // mismatch in an early segment ends the decode's wait while later segments are still being flushed).
    while (!prefill_done) {
      if (!decode->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    stop = true;
    side.join();
    return o;
  }

  bool landed() const {
    for (const DestinationRange& d : destinations()) {
      if (std::memcmp(pool.data() + d.offset, source.data() + d.offset, d.length) != 0) return false;
    }
    return true;
  }
  size_t untouched_bytes() const {  // pool bytes outside the destinations still hold their fill value
    std::vector<bool> in_range(pool.size());
    for (const DestinationRange& d : destinations()) {
      for (size_t i = 0; i < d.length; ++i) in_range[d.offset + i] = true;
    }
    size_t n = 0;
    for (size_t i = 0; i < pool.size(); ++i) n += !in_range[i] && pool[i] == std::byte{0xee};
    return n;
  }

  // Decode closes first (its close flushes while the prefill worker answers), then prefill. With UCX's peer
  // failure detection (tcp) a closed endpoint releases what was advertised through it; on shared memory
  // (heartbeats only) the writer is this very process, alive, so the memory stays quarantined.
  bool ucx_detects_peer_failure() const { return decode->peer_failure() == PeerFailure::kUcx; }
  void close_all() {
    Status closed = testing::close_with_peer(*to_prefill, *prefill, milliseconds(2000));
    EXPECT_TRUE(closed.is_ok() || to_prefill->failed()) << closed.message();
    EXPECT_TRUE(to_prefill->closed());
    Status released = registry.release_closed(*to_prefill);
    if (ucx_detects_peer_failure()) {
      EXPECT_TRUE(released.is_ok()) << released.message();
    } else {
      EXPECT_TRUE(to_prefill->peer_may_write());
      EXPECT_EQ(released.code(), StatusCode::kUnavailable) << released.message();
    }
    (void)testing::close_with_peer(*to_decode, *decode, milliseconds(2000));
    EXPECT_TRUE(to_decode->closed());
  }

  void TearDown() override {
    // Nothing held, nothing in flight, no message left unread on the decode side, whatever the test did.
    if (decode) {
      EXPECT_EQ(decode->queued_messages(), 0u);
    }

    if (to_prefill && to_decode) {
      close_all();
      RegistryCounts c = registry.counts();
      EXPECT_EQ(c.in_flight, 0u);
      EXPECT_EQ(c.quarantined, ucx_detects_peer_failure() ? 0 : c.failed);
      EXPECT_EQ(c.held_ranges == 0, c.quarantined == 0);
    }
    region.reset();
    to_prefill.reset();
    to_decode.reset();
    decode.reset();
    prefill.reset();
  }

  ScriptedFaults faults;
  size_t segment_bytes = kDefaultSegmentBytes;
  milliseconds prefill_ttl{60000};
  std::unique_ptr<Worker> decode, prefill;
  std::unique_ptr<Endpoint> to_prefill, to_decode;
  std::vector<std::byte> pool, source;
  std::unique_ptr<Region> region;
  RegionRegistry registry;
};

TEST_F(DisaggPair, ScatteredRangesByWorkerAddressLandAndVerify) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  Outcome o = run();
  ASSERT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  ASSERT_TRUE(o.decode.is_ok()) << o.decode.message();
  EXPECT_TRUE(landed());
  EXPECT_EQ(untouched_bytes(), kPoolBytes - (4096 + 512 + 1 + 8000 + 77));
  EXPECT_EQ(registry.counts().completed, 1u);
  EXPECT_EQ(faults.puts_seen, 5u);
  testing::expect_transports(*to_prefill);
  testing::expect_transports(*to_decode);
}

TEST_F(DisaggPair, ScatteredRangesBySockaddrLandAndVerify) {
  // UCX 1.13 makes client-server (sockaddr) connections through its TCP connection manager: with UCX_TLS naming
  // only shared-memory transports no connection request arrives (ctest registers this test under tcp only).
  // Same-host peers connect by worker address.
  ASSERT_FALSE(testing::expected_transports().count("tcp") == 0 && !testing::expected_transports().empty())
      << "sockaddr connections need tcp in UCX_TLS";
  ASSERT_NO_FATAL_FAILURE(connect(true));
  Outcome o = run();
  ASSERT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  ASSERT_TRUE(o.decode.is_ok()) << o.decode.message();
  EXPECT_TRUE(landed());
  EXPECT_EQ(registry.counts().completed, 1u);
  testing::expect_transports(*to_decode);
}

TEST_F(DisaggPair, DroppedPutIsAChecksumMismatchAndQuarantined) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  faults.puts = {{3, {PutFault::Kind::kDrop}}};
  Outcome o = run();
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();  // the sender cannot tell
  EXPECT_EQ(o.decode.code(), StatusCode::kCorrupt) << o.decode.message();
  EXPECT_NE(o.decode.message().find("checksum"), std::string::npos);
  EXPECT_FALSE(landed());
  RegistryCounts c = registry.counts();
  EXPECT_EQ(c.quarantined, 1u);
  EXPECT_EQ(c.completed, 0u);
  EXPECT_TRUE(registry.held(pool.data() + 12288, 1));
  // Still held after failure: the same memory cannot be advertised again until the endpoint is closed.
  IncomingTransfer again(kTransfer + 1, *to_prefill, registry, destinations());
  EXPECT_EQ(again.advertise(Deadline::after(milliseconds(1000))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.release_closed(*to_prefill).code(), StatusCode::kUnavailable);  // open: refused
  close_all();
  EXPECT_EQ(registry.held(pool.data() + 12288, 1), !ucx_detects_peer_failure());
  EXPECT_EQ(registry.counts().released_after_close, ucx_detects_peer_failure() ? 1u : 0u);
}

TEST_F(DisaggPair, CorruptedByteIsAChecksumMismatch) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  faults.puts = {{0, {PutFault::Kind::kCorrupt, 4095}}};
  Outcome o = run();
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  EXPECT_EQ(o.decode.code(), StatusCode::kCorrupt) << o.decode.message();
  // Exactly the one byte differs: the fault hit the private copy, not the source.
  size_t diff = 0;
  for (const DestinationRange& d : destinations()) {
    for (size_t i = 0; i < d.length; ++i) diff += pool[d.offset + i] != source[d.offset + i];
  }
  EXPECT_EQ(diff, 1u);
  EXPECT_EQ(pool[40960 + 4095], ~source[40960 + 4095]);
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

// Which path UCX takes for the hand-off's puts over shared memory, observed from outside: the decode worker is
// never progressed while the prefill puts and flushes. Into memory UCX allocated (Region::allocate, as a decode
// server's pools are) the puts go directly (posix/sysv: the writer maps the target's segment and copies into it),
// so the flush completes with every byte in place. Into memory that is only registered (Region::map of a heap
// buffer) UCX 1.13 has no direct put over shared memory and emulates it with active messages, which need the
// target's progress: the same flush is still pending after 300 ms, and completes once the target progresses. The
// second half shows that the first would fail if the puts fell back to the emulation.
TEST_F(DisaggPair, PutsIntoAllocatedMemoryNeedNoProgressOfTheTargetOverSharedMemory) {
  if (testing::expected_transports().count("sysv") == 0) GTEST_SKIP() << "over tcp every put needs the target's progress";
  ASSERT_NO_FATAL_FAILURE(connect(false));
  // Pages of a k3-bench request's size, a range cut short, a small one.
  const size_t lengths[] = {294912, 294912, 294912, 100000, 176};
  size_t total = 0;
  for (size_t l : lengths) total += l;
  auto allocated = Region::allocate(decode->shared_context(), total + 4096);
  ASSERT_TRUE(allocated) << allocated.error().message();
  EXPECT_TRUE((*allocated)->allocated());
  std::vector<std::byte> src(total);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<std::byte>((i * 7 + 3) % 253);
  auto key = to_decode->unpack_rkey((*allocated)->packed_rkey());
  ASSERT_TRUE(key) << key.error().message();
  // The connection's wire-up (once per endpoint, before any transfer in a server) needs both sides: a first flush
  // with both progressing.
  {
    ucp_request_param_t param{};
    void* flush = ucp_ep_flush_nbx(to_decode->handle(), &param);
    ASSERT_FALSE(UCS_PTR_IS_ERR(flush));
    Status wired = prefill->wait(
        [&] {
          decode->progress();
          return flush == nullptr || ucp_request_check_status(flush) != UCS_INPROGRESS;
        },
        Deadline::after(milliseconds(5000)), "wire-up");
    ASSERT_TRUE(wired.is_ok()) << wired.message();
    if (flush != nullptr) ucp_request_free(flush);
  }
  std::vector<PutRange> puts;
  size_t off = 0;
  for (size_t l : lengths) {  // in reverse order through the region, 64 bytes apart
    const size_t at = total + 4096 - off - l - 64 * puts.size() - 64;
    puts.push_back({src.data() + off, (*allocated)->address(at), l, &*key});
    off += l;
  }
  Status put = put_and_flush(*to_decode, kTransfer, puts, Deadline::after(milliseconds(5000)));
  ASSERT_TRUE(put.is_ok()) << put.message();
  off = 0;
  for (const PutRange& p : puts) {
    EXPECT_EQ(std::memcmp((*allocated)->base() + (p.remote - (*allocated)->address(0)), src.data() + off, p.length), 0);
    off += p.length;
  }

  // The control: the same kind of puts into the registered heap pool; the decode worker still not progressed.
  auto heap_key = to_decode->unpack_rkey(region->packed_rkey());
  ASSERT_TRUE(heap_key) << heap_key.error().message();
  std::vector<void*> requests;
  for (size_t at = 0; at + 8192 <= kPoolBytes; at += 8192) {
    ucp_request_param_t param{};
    void* r = ucp_put_nbx(to_decode->handle(), source.data() + at, 8192, region->address(at), heap_key->handle(), &param);
    ASSERT_FALSE(UCS_PTR_IS_ERR(r));
    if (r != nullptr) requests.push_back(r);
  }
  ucp_request_param_t param{};
  void* flush = ucp_ep_flush_nbx(to_decode->handle(), &param);
  ASSERT_FALSE(UCS_PTR_IS_ERR(flush));
  ASSERT_NE(flush, nullptr) << "the flush of emulated puts completed without the target";
  const Deadline held = Deadline::after(milliseconds(300));
  while (!held.expired()) prefill->progress();
  EXPECT_EQ(ucp_request_check_status(flush), UCS_INPROGRESS) << "puts into registered memory did not need the target";
  Status done = prefill->wait(
      [&] {
        decode->progress();
        return ucp_request_check_status(flush) != UCS_INPROGRESS;
      },
      Deadline::after(milliseconds(5000)), "emulated puts");
  EXPECT_TRUE(done.is_ok()) << done.message();
  EXPECT_EQ(ucp_request_check_status(flush), UCS_OK);
  ucp_request_free(flush);
  for (void* r : requests) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS) prefill->progress();
    ucp_request_free(r);
  }
  EXPECT_EQ(std::memcmp(pool.data(), source.data(), kPoolBytes), 0);
}

// Segments of 4096 bytes over the 12,686-byte stream of destinations() (4096 | 512 1 3583 | 4096 | 321 77): the
// puts are r0, r1, r2, r3 cut in three (3583, 4096, 321), r4, seven in all; four segments.
TEST_F(DisaggPair, SegmentedTransferLandsAndVerifies) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  segment_bytes = 4096;
  Outcome o = run();
  ASSERT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  ASSERT_TRUE(o.decode.is_ok()) << o.decode.message();
  EXPECT_TRUE(landed());
  EXPECT_EQ(untouched_bytes(), kPoolBytes - (4096 + 512 + 1 + 8000 + 77));
  EXPECT_EQ(faults.puts_seen, 7u);
  EXPECT_EQ(faults.messages_seen[static_cast<uint16_t>(MessageKind::kSegment)], 4u);
  EXPECT_EQ(registry.counts().completed, 1u);
}

// A window of two segments: the puts of segment k are posted only once segment k - 2's flush was reported, so
// what the sender sends after its puts waits behind at most two segments (disagg/put.h, Segments::window). Eight
// segments of 4 KiB each, one put each, the target progressing in its own thread.
TEST_F(DisaggPair, SegmentWindowBoundsThePutsAhead) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  auto key = to_decode->unpack_rkey(region->packed_rkey());
  ASSERT_TRUE(key) << key.error().message();
  constexpr size_t kSegments = 8, kBytes = 4096;
  std::vector<PutRange> puts;
  Segments segments;
  for (size_t k = 0; k < kSegments; ++k) {
    puts.push_back({source.data() + k * kBytes, region->address(k * kBytes), kBytes, &*key});
    segments.ends.push_back(k + 1);
  }
  std::vector<std::pair<char, size_t>> events;  // ('P', k): segment k posted; ('F', k): its flush reported
  segments.posted = [&](size_t k) {
    events.push_back({'P', k});
    return Status::ok();
  };
  segments.flushed = [&](size_t k) {
    events.push_back({'F', k});
    return Status::ok();
  };
  segments.window = 2;
  std::atomic<bool> stop{false};
  std::thread target([&] {
    while (!stop) {
      if (!decode->progress()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  Status put = put_and_flush(*to_decode, kTransfer, puts, segments, Deadline::after(milliseconds(5000)));
  stop = true;
  target.join();
  ASSERT_TRUE(put.is_ok()) << put.message();
  EXPECT_EQ(std::memcmp(pool.data(), source.data(), kSegments * kBytes), 0);
  auto at = [&](char what, size_t k) {
    return std::find(events.begin(), events.end(), std::make_pair(what, k)) - events.begin();
  };
  ASSERT_EQ(events.size(), 2 * kSegments);
  for (size_t k = 0; k < kSegments; ++k) {
    EXPECT_LT(at('P', k), at('F', k)) << k;
    if (k >= 2) {
      EXPECT_LT(at('F', k - 2), at('P', k)) << "segment " << k << " posted before segment " << k - 2 << " was flushed";
    }
  }
}

// Put 4 is bytes [8192, 12288) of the stream: segment 2 of 4. The receiver fails on that segment's checksum.
TEST_F(DisaggPair, CorruptedByteInAMiddleSegmentFailsTheTransfer) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  segment_bytes = 4096;
  faults.puts = {{4, {PutFault::Kind::kCorrupt, 100}}};
  Outcome o = run();
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  EXPECT_EQ(o.decode.code(), StatusCode::kCorrupt) << o.decode.message();
  EXPECT_NE(o.decode.message().find("segment 2: checksum mismatch"), std::string::npos) << o.decode.message();
  RegistryCounts c = registry.counts();
  EXPECT_EQ(c.quarantined, 1u);
  EXPECT_EQ(c.completed, 0u);
  EXPECT_TRUE(registry.held(pool.data() + 12288, 1));
}

// Put 6 (r4, 77 bytes) lies in the last segment; without it that segment's bytes do not match.
TEST_F(DisaggPair, DroppedPutInTheLastSegmentFailsTheTransfer) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  segment_bytes = 4096;
  faults.puts = {{6, {PutFault::Kind::kDrop}}};
  Outcome o = run();
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  EXPECT_EQ(o.decode.code(), StatusCode::kCorrupt) << o.decode.message();
  EXPECT_NE(o.decode.message().find("segment 3: checksum mismatch"), std::string::npos) << o.decode.message();
  EXPECT_FALSE(landed());
  EXPECT_EQ(registry.counts().quarantined, 1u);
  EXPECT_EQ(registry.counts().completed, 0u);
}

// Every byte landed and the completion arrived, but the last segment was never announced, so its bytes were never
// verified: not ready, failed at the deadline, quarantined.
TEST_F(DisaggPair, LostLastSegmentNotificationFailsAtTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  segment_bytes = 4096;
  faults.dropped_nth = {{static_cast<uint16_t>(MessageKind::kSegment), 3}};
  Outcome o = run(milliseconds(300));
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  EXPECT_EQ(o.decode.code(), StatusCode::kUnavailable) << o.decode.message();
  EXPECT_NE(o.decode.message().find("deadline"), std::string::npos) << o.decode.message();
  EXPECT_TRUE(landed());
  EXPECT_EQ(faults.messages_seen[static_cast<uint16_t>(MessageKind::kSegment)], 4u);
  EXPECT_EQ(registry.counts().quarantined, 1u);
  EXPECT_EQ(registry.counts().completed, 0u);
}

// A segment announced twice (a sender out of step) is refused: each offset is verified once, in order.
TEST_F(DisaggPair, SegmentOutOfOrderIsRefused) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  IncomingTransfer in(kTransfer, *to_prefill, registry, destinations());
  std::atomic<bool> stop{false};
  Status sent;
  std::thread prefill_side([&] {
    sent = to_decode->send(encode_segment(prefill->instance(), kTransfer, {1, 4096, 512, 0}), MessageKind::kSegment,
                           Deadline::after(milliseconds(2000)));
    while (!stop) {
      if (!prefill->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  ASSERT_TRUE(in.advertise(Deadline::after(milliseconds(1000))).is_ok());
  Status st = in.wait(Deadline::after(milliseconds(2000)), milliseconds(2000));
  stop = true;
  prefill_side.join();
  EXPECT_TRUE(sent.is_ok()) << sent.message();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.message();
  EXPECT_NE(st.message().find("expected segment 0 at 0"), std::string::npos) << st.message();
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

TEST_F(DisaggPair, DelayWithinTheDeadlineStillCompletes) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  faults.puts = {{2, {PutFault::Kind::kDelay, 0, milliseconds(50)}}};
  Outcome o = run();
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  EXPECT_TRUE(o.decode.is_ok()) << o.decode.message();
  EXPECT_TRUE(landed());
}

TEST_F(DisaggPair, SlowSenderMissesTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  faults.puts = {{1, {PutFault::Kind::kDelay, 0, milliseconds(2500)}}};  // longer than the prefill deadline
  Outcome o = run();
  EXPECT_EQ(o.prefill.code(), StatusCode::kUnavailable) << o.prefill.message();
  EXPECT_TRUE(to_decode->closed());  // a missed deadline closes the writer's endpoint
  EXPECT_EQ(o.decode.code(), StatusCode::kUnavailable) << o.decode.message();
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

TEST_F(DisaggPair, LostCompletionMessageFailsAtTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  faults.dropped_kinds = {static_cast<uint16_t>(MessageKind::kCompletion)};
  auto start = Clock::now();
  Outcome o = run(milliseconds(300));
  EXPECT_TRUE(o.prefill.is_ok()) << o.prefill.message();
  EXPECT_EQ(o.decode.code(), StatusCode::kUnavailable) << o.decode.message();
  EXPECT_NE(o.decode.message().find("deadline"), std::string::npos) << o.decode.message();
  EXPECT_TRUE(landed());  // the bytes arrived, but nothing proved it: not ready
  EXPECT_LT(Clock::now() - start, milliseconds(2500));
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

TEST_F(DisaggPair, CompletionFromAnotherPeerIsIgnored) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  // A third instance (a prefill that served an earlier attempt with the same room, say) sends a segment and a
  // completion whose sizes and checksums match the destination bytes as they are: they must not make the transfer
  // ready.
  WorkerOptions o;
  o.instance = 33;
  std::unique_ptr<Worker> other = std::move(Worker::create(o).value());
  std::unique_ptr<Endpoint> other_ep =
      std::move(Endpoint::connect_address(*other, decode->address().value()).value());
  IncomingTransfer in(kTransfer, *to_prefill, registry, destinations());
  std::atomic<bool> stop{false};
  std::thread prefill_side([&] {  // the real prefill only progresses (heartbeats)
    while (!stop) {
      if (!prefill->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  ASSERT_TRUE(in.advertise(Deadline::after(milliseconds(1000))).is_ok());
  Completion c;
  Checksum sum;
  for (const DestinationRange& d : destinations()) {
    sum.update({pool.data() + d.offset, d.length});
    c.bytes += d.length;
  }
  c.ranges = static_cast<uint32_t>(destinations().size());
  c.segments = 1;
  SegmentDigest digest;
  digest.add(sum.value());
  c.checksum = digest.value();
  const Segment whole{0, 0, c.bytes, sum.value()};
  Status sent;
  std::thread other_side([&] {
    sent = other_ep->send(encode_segment(other->instance(), kTransfer, whole), MessageKind::kSegment,
                          Deadline::after(milliseconds(2000)));
    if (sent.is_ok()) {
      sent = other_ep->send(encode_completion(other->instance(), kTransfer, c), MessageKind::kCompletion,
                            Deadline::after(milliseconds(2000)));
    }
    while (!stop) {
      if (!other->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Status st = in.wait(Deadline::after(milliseconds(500)), milliseconds(2000));
  stop = true;
  prefill_side.join();
  other_side.join();
  EXPECT_TRUE(sent.is_ok()) << sent.message();
  EXPECT_TRUE(decode->last_heard(33).has_value());  // it did arrive
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
  EXPECT_NE(st.message().find("deadline"), std::string::npos) << st.message();
  EXPECT_EQ(registry.counts().completed, 0u);
  (void)testing::close_with_peer(*other_ep, *decode, milliseconds(2000));
  other_ep.reset();
}

TEST_F(DisaggPair, MalformedMessagesAreCountedAndDropped) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  std::vector<std::byte> completion = encode_completion(prefill->instance(), kTransfer, {});
  std::vector<std::byte> bad_magic = completion;
  bad_magic[0] = std::byte{0};
  std::vector<std::byte> short_header(completion.begin(), completion.begin() + 10);
  // The decode thread progresses until a message is queued: the good one sent last, so the two before it have
  // been handled by then.
  std::atomic<bool> queued{false};
  std::thread decode_side([&] {
    Deadline d = Deadline::after(milliseconds(3000));
    while (!d.expired() && decode->queued_messages() == 0) {
      if (!decode->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    queued = true;
  });
  Status a = to_decode->send(bad_magic, MessageKind::kCompletion, Deadline::after(milliseconds(2000)));
  Status b = to_decode->send(short_header, MessageKind::kCompletion, Deadline::after(milliseconds(2000)));
  Status c = to_decode->send(completion, MessageKind::kCompletion, Deadline::after(milliseconds(2000)));
  while (!queued) prefill->progress();
  decode_side.join();
  EXPECT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  EXPECT_EQ(decode->malformed_messages(), 2u);
  ASSERT_EQ(decode->queued_messages(), 1u);
  EXPECT_TRUE(decode->take(MessageKind::kCompletion, kTransfer, prefill->instance()).has_value());
}

// The prefill worker runs in its own thread (each worker has one thread) and only progresses: it sends heartbeats
// and nothing else. With the fault policy stalling it (a frozen process), the decode side declares it silent after
// the silence limit (500 ms, five heartbeat intervals), long before the deadline; progressing normally, a wait
// more than twice the silence limit long runs into its deadline instead.
Status wait_with_prefill_progressing(DisaggPair* t, bool stalled, milliseconds deadline, milliseconds silence,
                                     milliseconds* took);

TEST_F(DisaggPair, StalledPeerIsSilentAndFailsBeforeTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  milliseconds took{};
  Status st = wait_with_prefill_progressing(this, true, milliseconds(5000), milliseconds(500), &took);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("silent"), std::string::npos) << st.message();
  // Silence counts from the last heartbeat heard, which may precede the wait by up to one interval (100 ms).
  EXPECT_GE(took, milliseconds(500 - 100));
  EXPECT_LT(took, milliseconds(3000));
  EXPECT_TRUE(to_prefill->failed());
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

TEST_F(DisaggPair, HeartbeatsKeepAQuietPeerAlive) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  milliseconds took{};
  Status st = wait_with_prefill_progressing(this, false, milliseconds(1200), milliseconds(500), &took);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("deadline"), std::string::npos) << st.message();  // not "silent"
  EXPECT_GE(took, milliseconds(1200));
  EXPECT_FALSE(to_prefill->failed());
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

TEST_F(DisaggPair, UnreadDestinationsExpire) {
  prefill_ttl = milliseconds(200);
  ASSERT_NO_FATAL_FAILURE(connect(false));
  // The prefill side never gets the request, so nobody asks for these destinations.
  milliseconds took{};
  Status st = wait_with_prefill_progressing(this, false, milliseconds(400), milliseconds(1000), &took);
  EXPECT_NE(st.message().find("deadline"), std::string::npos) << st.message();
  EXPECT_EQ(prefill->queued_messages(), 0u);
  EXPECT_EQ(prefill->expired_messages(), 1u);
}

TEST_F(DisaggPair, SenderReportsMismatchedRanges) {
  ASSERT_NO_FATAL_FAILURE(connect(false));
  auto src = sources();
  src.pop_back();
  Outcome o = run(milliseconds(3000), milliseconds(2000), src);
  EXPECT_EQ(o.prefill.code(), StatusCode::kInvalidArgument) << o.prefill.message();
  EXPECT_EQ(o.decode.code(), StatusCode::kUnavailable);
  EXPECT_NE(o.decode.message().find("sender failed"), std::string::npos) << o.decode.message();
  EXPECT_EQ(faults.puts_seen, 0u);
  EXPECT_EQ(registry.counts().quarantined, 1u);
}

Status wait_with_prefill_progressing(DisaggPair* t, bool stalled, milliseconds deadline, milliseconds silence,
                                     milliseconds* took) {
  std::atomic<bool> stop{false};
  std::thread prefill([&] {
    while (!stop) {
      if (!t->prefill->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  IncomingTransfer in(kTransfer, *t->to_prefill, t->registry, t->destinations());
  Status st = in.advertise(Deadline::after(milliseconds(1000)));
  t->faults.stalled = stalled;
  auto start = Clock::now();
  if (st.is_ok()) st = in.wait(Deadline::after(deadline), silence);
  *took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  stop = true;
  prefill.join();
  t->faults.stalled = false;
  return st;
}

}  // namespace
}  // namespace kestrel::disagg
