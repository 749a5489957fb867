// disagg/ without UCX traffic: the control message format (round trips, every truncation and bad field rejected,
// older versions refused),
// the checksum (XXH3-64 reference vectors; order matters, range boundaries do not), and the region registry's
// rules (overlap refused, completion releases, failure quarantines until the peer cannot write).
#include <gtest/gtest.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "disagg/checksum.h"
#include "disagg/endpoint.h"
#include "disagg/messages.h"
#include "disagg/region_registry.h"
#include "disagg/worker.h"

namespace kestrel::disagg {
namespace {

std::span<const std::byte> bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(DisaggChecksum, MatchesXxh3ReferenceVectors) {
  // XXH3-64, seed 0, as printed by xxHash's own CLI (`printf foobar | xxhsum -H3`): "", "a", "foobar".
  EXPECT_EQ(Checksum().value(), 0x2d06800538d394c2ull);
  Checksum a;
  a.update(bytes("a"));
  EXPECT_EQ(a.value(), 0xe6c632b61e964e1full);
  Checksum f;
  f.update(bytes("foobar"));
  EXPECT_EQ(f.value(), 0xd78fda63144c5c84ull);
}

TEST(DisaggChecksum, RangesActAsOneBufferButOrderMatters) {
  Checksum split, reordered;
  split.update(bytes("foo"));
  split.update(bytes("bar"));
  EXPECT_EQ(split.value(), 0xd78fda63144c5c84ull);
  reordered.update(bytes("bar"));
  reordered.update(bytes("foo"));
  EXPECT_NE(reordered.value(), split.value());
}

// A transfer's ranges have any lengths (pages, state, a 176-byte record): the value over a long buffer cut at
// arbitrary points (empty pieces included), across XXH3's internal stripe and block sizes, equals the value of the
// whole; one flipped bit anywhere changes it.
TEST(DisaggChecksum, AnyCutOfALongBufferGivesTheSameValue) {
  std::vector<std::byte> buf(300000);
  uint32_t x = 12345;
  for (auto& b : buf) b = static_cast<std::byte>((x = x * 1664525u + 1013904223u) >> 24);
  Checksum whole;
  whole.update(buf);
  for (size_t piece : {size_t{1}, size_t{63}, size_t{64}, size_t{176}, size_t{255}, size_t{1024}, size_t{1025},
                       size_t{65536}, size_t{110592}}) {
    SCOPED_TRACE(piece);
    Checksum cut;
    for (size_t at = 0; at < buf.size(); at += piece) {
      cut.update(std::span<const std::byte>(buf).subspan(at, std::min(piece, buf.size() - at)));
      cut.update({});
    }
    EXPECT_EQ(cut.value(), whole.value());
  }
  for (size_t at : {size_t{0}, size_t{1000}, buf.size() - 1}) {
    std::vector<std::byte> flipped = buf;
    flipped[at] ^= std::byte{0x10};
    Checksum c;
    c.update(flipped);
    EXPECT_NE(c.value(), whole.value()) << at;
  }
}

Destinations sample() {
  Destinations d;
  d.rkeys = {{std::byte{1}, std::byte{2}, std::byte{3}}, {std::byte{9}}};
  d.ranges = {{0x1000, 4096, 0}, {0x7fff0000, 1, 1}, {0xffffffffffff0000ull, 0xffff, 0}};
  return d;
}

TEST(DisaggMessages, DestinationsRoundTrip) {
  std::vector<std::byte> m = encode_destinations(42, 7, sample());
  std::span<const std::byte> body;
  Result<MessageHeader> h = decode_header(m, &body);
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->kind, MessageKind::kDestinations);
  EXPECT_EQ(h->sender, 42u);
  EXPECT_EQ(h->transfer_id, 7u);
  EXPECT_EQ(h->pid, static_cast<uint32_t>(getpid()));
  Result<Destinations> d = decode_destinations(body);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->rkeys, sample().rkeys);
  ASSERT_EQ(d->ranges.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d->ranges[i].address, sample().ranges[i].address);
    EXPECT_EQ(d->ranges[i].length, sample().ranges[i].length);
    EXPECT_EQ(d->ranges[i].rkey, sample().ranges[i].rkey);
  }
}

TEST(DisaggMessages, CompletionAndHeartbeatRoundTrip) {
  Completion c{0, 5, 123456789012ull, 13, 0xdeadbeefcafef00dull};
  std::vector<std::byte> m = encode_completion(1, 99, c);
  std::span<const std::byte> body;
  Result<MessageHeader> h = decode_header(m, &body);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->kind, MessageKind::kCompletion);
  Result<Completion> back = decode_completion(body);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->status, 0u);
  EXPECT_EQ(back->ranges, 5u);
  EXPECT_EQ(back->bytes, c.bytes);
  EXPECT_EQ(back->segments, 13u);
  EXPECT_EQ(back->checksum, c.checksum);
  std::vector<std::byte> hb = encode_heartbeat(3);
  h = decode_header(hb, &body);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->kind, MessageKind::kHeartbeat);
  EXPECT_TRUE(body.empty());
  std::vector<std::byte> q = encode_queued(3, 0x8000000000000044ull);
  h = decode_header(q, &body);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->kind, MessageKind::kQueued);
  EXPECT_EQ(h->sender, 3u);
  EXPECT_EQ(h->transfer_id, 0x8000000000000044ull);
  EXPECT_TRUE(body.empty());
}

TEST(DisaggMessages, CancelRoundTrip) {
  for (CancelReason r : {CancelReason::kClient, CancelReason::kEnded}) {
    std::vector<std::byte> m = encode_cancel(8, 0x8000000000000031ull, r);
    std::span<const std::byte> body;
    Result<MessageHeader> h = decode_header(m, &body);
    ASSERT_TRUE(h) << h.error().message();
    EXPECT_EQ(h->kind, MessageKind::kCancel);
    EXPECT_EQ(h->sender, 8u);
    EXPECT_EQ(h->transfer_id, 0x8000000000000031ull);
    Result<CancelReason> back = decode_cancel(body);
    ASSERT_TRUE(back) << back.error().message();
    EXPECT_EQ(*back, r);
  }
}

TEST(DisaggMessages, SegmentRoundTrip) {
  Segment s{7, 0xfffffffff0000000ull, 0x0fffffff, 0x0123456789abcdefull};
  std::vector<std::byte> m = encode_segment(4, 99, s);
  std::span<const std::byte> body;
  Result<MessageHeader> h = decode_header(m, &body);
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->kind, MessageKind::kSegment);
  EXPECT_EQ(h->sender, 4u);
  EXPECT_EQ(h->transfer_id, 99u);
  Result<Segment> back = decode_segment(body);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->index, 7u);
  EXPECT_EQ(back->offset, s.offset);
  EXPECT_EQ(back->length, s.length);
  EXPECT_EQ(back->checksum, s.checksum);
}

// The completion's digest is the checksum of the segment checksums as 8 little-endian bytes each, in order.
TEST(DisaggMessages, SegmentDigestIsTheChecksumOfTheLittleEndianSums) {
  SegmentDigest d;
  d.add(0x0807060504030201ull);
  d.add(0x100f0e0d0c0b0a09ull);
  std::vector<std::byte> le;
  for (int i = 1; i <= 16; ++i) le.push_back(static_cast<std::byte>(i));
  Checksum c;
  c.update(le);
  EXPECT_EQ(d.value(), c.value());
  SegmentDigest swapped;
  swapped.add(0x100f0e0d0c0b0a09ull);
  swapped.add(0x0807060504030201ull);
  EXPECT_NE(swapped.value(), d.value());
  EXPECT_EQ(SegmentDigest().value(), Checksum().value());
}

TEST(DisaggMessages, EveryTruncationIsRejected) {
  std::vector<std::byte> d = encode_destinations(1, 2, sample());
  std::vector<std::byte> c = encode_completion(1, 2, {0, 1, 2, 3, 4});
  std::vector<std::byte> s = encode_segment(1, 2, {0, 0, 4096, 5});
  std::vector<std::byte> x = encode_cancel(1, 2, CancelReason::kEnded);
  for (const auto* m : {&d, &c, &s, &x}) {
    for (size_t n = 0; n < m->size(); ++n) {
      std::span<const std::byte> cut(m->data(), n), body;
      Result<MessageHeader> h = decode_header(cut, &body);
      if (!h) {
        EXPECT_EQ(h.error().code(), StatusCode::kCorrupt);
        continue;
      }
      bool ok = h->kind == MessageKind::kDestinations ? decode_destinations(body).has_value()
                : h->kind == MessageKind::kSegment     ? decode_segment(body).has_value()
                : h->kind == MessageKind::kCancel      ? decode_cancel(body).has_value()
                                                       : decode_completion(body).has_value();
      EXPECT_FALSE(ok) << "accepted " << n << " of " << m->size() << " bytes";
    }
  }
}

TEST(DisaggMessages, BadFieldsAreRejected) {
  std::vector<std::byte> m = encode_completion(1, 2, {});
  std::span<const std::byte> body;
  auto flipped = [&](size_t at, std::byte v) {
    std::vector<std::byte> x = m;
    x[at] = v;
    return x;
  };
  EXPECT_FALSE(decode_header(flipped(0, std::byte{0}), &body));   // magic
  EXPECT_FALSE(decode_header(flipped(4, std::byte{1}), &body));   // version 1 (its checksum was FNV-1a)
  EXPECT_FALSE(decode_header(flipped(4, std::byte{2}), &body));   // version 2 (one checksum, no segments)
  EXPECT_FALSE(decode_header(flipped(4, std::byte{3}), &body));   // version 3 (no cancel, no status 3)
  EXPECT_FALSE(decode_header(flipped(4, std::byte{4}), &body));   // version 4 (no queued notice)
  EXPECT_FALSE(decode_header(flipped(4, std::byte{6}), &body));   // a later version
  EXPECT_FALSE(decode_header(flipped(6, std::byte{0}), &body));   // kind 0
  EXPECT_FALSE(decode_header(flipped(6, std::byte{7}), &body));   // kind past the last
  std::vector<std::byte> trailing = m;
  trailing.push_back(std::byte{0});
  ASSERT_TRUE(decode_header(trailing, &body));
  EXPECT_FALSE(decode_completion(body));  // trailing byte
  for (Segment bad_segment : {Segment{0, 100, 0, 1}, Segment{0, 0xffffffffffffff00ull, 0x200, 1}}) {  // empty, wraps
    std::vector<std::byte> seg = encode_segment(1, 2, bad_segment);
    ASSERT_TRUE(decode_header(seg, &body));
    EXPECT_FALSE(decode_segment(body));
  }
  for (uint32_t reason : {0u, 3u}) {  // cancel reasons: none, unknown
    std::vector<std::byte> cancel = encode_cancel(1, 2, CancelReason::kClient);
    cancel[cancel.size() - 4] = static_cast<std::byte>(reason);
    ASSERT_TRUE(decode_header(cancel, &body));
    EXPECT_FALSE(decode_cancel(body)) << reason;
  }
  std::vector<std::byte> cancel = encode_cancel(1, 2, CancelReason::kClient);
  cancel.push_back(std::byte{0});
  ASSERT_TRUE(decode_header(cancel, &body));
  EXPECT_FALSE(decode_cancel(body));  // trailing byte
  std::vector<std::byte> seg = encode_segment(1, 2, {0, 0, 1, 1});
  seg.push_back(std::byte{0});
  ASSERT_TRUE(decode_header(seg, &body));
  EXPECT_FALSE(decode_segment(body));  // trailing byte
  Destinations bad = sample();
  bad.ranges[1].rkey = 2;  // only two rkeys
  std::vector<std::byte> d = encode_destinations(1, 2, bad);
  ASSERT_TRUE(decode_header(d, &body));
  EXPECT_FALSE(decode_destinations(body));
  bad = sample();
  bad.ranges[0] = {0xfffffffffffff000ull, 0x2000, 0};  // wraps around
  d = encode_destinations(1, 2, bad);
  ASSERT_TRUE(decode_header(d, &body));
  EXPECT_FALSE(decode_destinations(body));
}

// A worker connected to itself over tcp (UCX's peer failure detection: a closed endpoint stops the peer) or over
// shared memory (heartbeats only: the peer, this process, may write while it lives).
struct Loopback {
  explicit Loopback(const char* tls) {
    WorkerOptions o;
    o.transports = tls;
    worker = std::move(Worker::create(o).value());
    ep = std::move(Endpoint::connect_address(*worker, worker->address().value()).value());
    ep->set_peer(worker->instance());
  }
  ~Loopback() { ep.reset(); }
  std::unique_ptr<Worker> worker;
  std::unique_ptr<Endpoint> ep;
};

TEST(DisaggRegistry, OverlapIsRefusedAndCompletionReleases) {
  Loopback lo("tcp");
  std::vector<std::byte> pool(1024);
  RegionRegistry r;
  HeldRange a{pool.data(), 100}, b{pool.data() + 200, 50};
  ASSERT_TRUE(r.advertise(1, lo.ep->id(), std::vector{a, b}).is_ok());
  EXPECT_TRUE(r.held(pool.data() + 99, 1));
  EXPECT_FALSE(r.held(pool.data() + 100, 100));
  EXPECT_TRUE(r.held(pool.data() + 150, 51));
  // Overlaps at either end, inside, around; a duplicate id; ranges overlapping each other; empty; zero length.
  EXPECT_FALSE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 99, 2}}).is_ok());
  EXPECT_FALSE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 249, 10}}).is_ok());
  EXPECT_FALSE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 190, 100}}).is_ok());
  EXPECT_FALSE(r.advertise(1, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 500, 1}}).is_ok());
  EXPECT_FALSE(
      r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 500, 10}, {pool.data() + 505, 1}}).is_ok());
  EXPECT_FALSE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{}).is_ok());
  EXPECT_FALSE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 500, 0}}).is_ok());
  EXPECT_FALSE(r.held(pool.data() + 500, 10));  // nothing of the refused ones was recorded
  // Adjacent is fine.
  EXPECT_TRUE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 100, 100}}).is_ok());
  EXPECT_EQ(r.counts().in_flight, 2u);
  EXPECT_EQ(r.counts().held_ranges, 3u);
  EXPECT_TRUE(r.complete(1).is_ok());
  EXPECT_FALSE(r.complete(1).is_ok());
  EXPECT_FALSE(r.held(pool.data(), 100));
  EXPECT_TRUE(r.advertise(3, lo.ep->id(), std::vector{a}).is_ok());  // reusable after completion
  EXPECT_TRUE(r.complete(2).is_ok());
  EXPECT_TRUE(r.complete(3).is_ok());
  RegistryCounts c = r.counts();
  EXPECT_EQ(c.in_flight + c.quarantined + c.held_ranges, 0u);
  EXPECT_EQ(c.completed, 3u);
}

TEST(DisaggRegistry, FailureQuarantinesUntilTheEndpointIsClosed) {
  Loopback lo("tcp");
  std::vector<std::byte> pool(1024);
  RegionRegistry r;
  ASSERT_TRUE(r.advertise(1, lo.ep->id(), std::vector<HeldRange>{{pool.data(), 100}}).is_ok());
  ASSERT_TRUE(r.advertise(2, lo.ep->id(), std::vector<HeldRange>{{pool.data() + 100, 100}}).is_ok());
  ASSERT_TRUE(r.fail(1).is_ok());
  EXPECT_FALSE(r.complete(1).is_ok());  // a failed transfer is never completed
  EXPECT_EQ(r.counts().quarantined, 1u);
  EXPECT_FALSE(r.advertise(3, lo.ep->id(), std::vector<HeldRange>{{pool.data(), 100}}).is_ok());
  EXPECT_EQ(r.release_closed(*lo.ep).code(), StatusCode::kUnavailable);  // still open
  ASSERT_TRUE(lo.ep->close(Deadline::after(std::chrono::seconds(2))).is_ok());
  ASSERT_TRUE(r.release_closed(*lo.ep).is_ok());
  RegistryCounts c = r.counts();
  EXPECT_EQ(c.in_flight + c.quarantined + c.held_ranges, 0u);
  EXPECT_EQ(c.failed, 2u);  // the one still in flight on the closed endpoint counts as failed
  EXPECT_EQ(c.released_after_close, 2u);
  EXPECT_TRUE(r.advertise(3, lo.ep->id(), std::vector<HeldRange>{{pool.data(), 200}}).is_ok());
  EXPECT_TRUE(r.complete(3).is_ok());
}

TEST(DisaggRegistry, SharedMemoryPeerThatLivesKeepsItsQuarantine) {
  Loopback lo("shm");
  ASSERT_EQ(lo.worker->peer_failure(), PeerFailure::kHeartbeat);
  std::vector<std::byte> pool(64);
  RegionRegistry r;
  ASSERT_TRUE(r.advertise(1, lo.ep->id(), std::vector<HeldRange>{{pool.data(), 64}}).is_ok());
  ASSERT_TRUE(r.fail(1).is_ok());
  // The peer (this process) has been heard from: its pid is known and it is running.
  Deadline d = Deadline::after(std::chrono::seconds(2));
  while (!lo.worker->pid_of(lo.worker->instance()) && !d.expired()) lo.worker->progress();
  ASSERT_EQ(lo.worker->pid_of(lo.worker->instance()), static_cast<uint32_t>(getpid()));
  ASSERT_TRUE(lo.ep->close(Deadline::after(std::chrono::seconds(2))).is_ok());
  EXPECT_TRUE(lo.ep->peer_may_write());
  EXPECT_EQ(r.release_closed(*lo.ep).code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.counts().quarantined, 1u);
  EXPECT_TRUE(r.held(pool.data(), 1));
}

TEST(DisaggWorker, PeerFailureModeFollowsTheTransports) {
  for (auto [tls, mode] : {std::pair{"tcp", PeerFailure::kUcx}, std::pair{"shm", PeerFailure::kHeartbeat},
                           std::pair{"posix,cma", PeerFailure::kHeartbeat}, std::pair{"shm,tcp", PeerFailure::kUcx},
                           std::pair{"^tcp", PeerFailure::kUcx}}) {
    WorkerOptions o;
    o.transports = tls;
    auto w = Worker::create(o);
    ASSERT_TRUE(w) << tls << ": " << w.error().message();
    EXPECT_EQ((*w)->peer_failure(), mode) << tls;
  }
}

}  // namespace
}  // namespace kestrel::disagg
