// One request's state transfer from a prefill instance to a decode instance (the push model: the decode side
// owns the destination memory and sends its addresses; the prefill side writes into it).
//
//   decode (IncomingTransfer)                         prefill (OutgoingTransfer)
//   advertise(): lease ranges, send kDestinations ──▶ wait_destinations()
//                                                     run(): per segment (segment_bytes of the ranges' byte
//                                                            stream): put its ranges, checksum its sources
//                                                            (still in cache), post a flush   → kPosted
//   wait()/poll(): per kSegment, verify its ◀──────── flush of segment k done: kSegment k (offset, length,
//   destination bytes (while k + 1 is written)        checksum), while segment k + 1 is put
//                                                     every flush done                  → kFlushed
//   all segments verified + ◀── kCompletion (sizes, segment count, digest of the segment checksums) → kCompleted
//   the completion matches → kCompleted (ranges free) or kFailed (ranges quarantined until the peer cannot write)
//
// Every byte is verified once, by the segment that covers it, after its flush; the completion confirms that the
// verified segments are all of them. The receiver's pass over segment k overlaps the sender's copy of k + 1 (on
// another core), and the sender's checksum reads bytes its put has just read, so a hand-off costs about one copy
// plus one cached pass, not a copy plus two passes from memory.
//
// Every state has a deadline. The decode side also fails when the endpoint reports an error (peer died,
// connection lost), when the peer has been silent (no message, heartbeats included) for longer than the given
// limit, when the sender reports that it gave up, or at once when a segment's checksum does not match (the rest
// of the transfer lands in quarantined memory). A missing segment announcement fails at the deadline. Nothing is
// ready until every segment matched and the completion agrees.
//
// Cancel (decode → prefill, kCancel): IncomingTransfer::cancel() asks the sender to stop. The ranges stay leased
// until the sender confirms that it no longer writes: a completion (status 0: it had finished; withdrawn: it never
// put; cancelled: it stopped and flushed what it had put), or else the usual failure rules (deadline, silence,
// endpoint error: quarantined until the peer cannot write). OutgoingTransfer::run() looks for the cancel before
// every put; once it is there it posts no more puts, flushes the ones posted, and answers with status cancelled.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/result.h"
#include "disagg/deadline.h"
#include "disagg/endpoint.h"
#include "disagg/memory.h"
#include "disagg/messages.h"
#include "disagg/region_registry.h"

namespace kestrel::disagg {

// kWithdrawn (decode side): the sender withdrew before any put, so the ranges were freed, not quarantined.
// kCancelled: stopped at the receiver's cancel, every put issued flushed (sender), the ranges freed (receiver).
enum class TransferState { kCreated, kAdvertised, kPosted, kFlushed, kCompleted, kFailed, kWithdrawn, kCancelled };
const char* to_string(TransferState s);

struct DestinationRange {
  const Region* region = nullptr;
  size_t offset = 0;
  size_t length = 0;
};

// The default segment size of a transfer (bench/pd_transfer_bench --segment-kib, docs/PERFORMANCE.md: 256 KiB to
// 4 MiB measured; over shared memory with direct puts the receiver's verification of a segment is the slower half
// of the pipeline and smaller segments overlap it better).
inline constexpr size_t kDefaultSegmentBytes = size_t{512} << 10;
// At most this many bytes of segments posted and not yet flushed (at least two segments, so that one is put
// while the previous one is verified): whatever the sender sends after its puts (heartbeats, segment
// announcements) waits behind at most that much on a tcp connection (disagg/put.h, Segments::window).
inline constexpr size_t kMaxBytesAhead = size_t{2} << 20;

class IncomingTransfer {
 public:
  // `id` is non-zero and unique among this worker's live transfers (the router's bootstrap room).
  IncomingTransfer(uint64_t id, Endpoint& ep, RegionRegistry& registry, std::vector<DestinationRange> ranges);
  ~IncomingTransfer();  // an unfinished transfer is failed (its ranges quarantined); its unread messages dropped
  IncomingTransfer(const IncomingTransfer&) = delete;
  IncomingTransfer& operator=(const IncomingTransfer&) = delete;

  // kCreated → kAdvertised: leases the ranges and sends their addresses and rkeys to the peer.
  Status advertise(Deadline deadline);
  // kAdvertised → kCompleted, or kFailed with the reason returned (kCorrupt for a size or checksum mismatch, a
  // segment out of order, or one that does not match; kUnavailable for a lost, silent or failing peer or a missed
  // deadline). Segments are verified as they arrive. When the endpoint knows its peer's instance id, `silence`
  // applies and only that peer's segments and completion count.
  Status wait(Deadline deadline, std::chrono::milliseconds silence);
  // The non-blocking form of wait() for a caller that drives the worker itself (many transfers on one thread):
  // nullopt while nothing has happened yet (no completion, the peer neither failed nor silent, the deadline not
  // passed); otherwise what wait() would return, with the same state change.
  // `renewal` (> 0): the sender's kQueued notices (it holds the request and the destinations, its prompt is still
  // queued or running) extend the deadline to the last notice + renewal.
  std::optional<Status> poll(Deadline deadline, std::chrono::milliseconds silence,
                             std::chrono::milliseconds renewal = std::chrono::milliseconds(0));
  // When the last kQueued notice came (nullopt: none).
  std::optional<Clock::time_point> queued_at() const { return queued_at_; }
  // kAdvertised only: sends kCancel. The transfer goes on until the sender confirms (then kCancelled, kWithdrawn,
  // or kCompleted if it had finished first) or fails as any other (quarantined). A completion with status
  // cancelled is accepted only after this was sent.
  Status cancel(CancelReason reason, Deadline deadline);
  bool cancel_sent() const { return cancel_sent_; }

  uint64_t id() const { return id_; }
  TransferState state() const { return state_; }

 private:
  Status fail(Status reason);
  // One look at the inbox and the peer: nullopt while still waiting, else the outcome.
  std::optional<Status> step(std::chrono::milliseconds silence);
  // A segment announcement: verified now (nullopt) or the transfer fails (the reason).
  std::optional<Status> verify_segment(const Message& message);
  // With the completion in hand: nullopt while announced segments are still to come, else the outcome.
  std::optional<Status> settle();

  uint64_t id_;
  Endpoint& ep_;
  RegionRegistry& registry_;
  std::vector<DestinationRange> ranges_;
  std::vector<uint64_t> starts_;  // stream offset of each range
  uint64_t total_ = 0;
  uint64_t verified_to_ = 0;  // the stream before this offset is verified
  uint32_t segments_ = 0;     // segments verified
  SegmentDigest digest_;
  std::optional<Completion> completion_;
  TransferState state_ = TransferState::kCreated;
  Clock::time_point advertised_at_{};
  std::optional<Clock::time_point> queued_at_;
  bool cancel_sent_ = false;
};

// Waits for the kDestinations message of transfer `id` on the worker; the sender's instance id goes to *sender.
Result<Destinations> wait_destinations(Worker& worker, uint64_t id, Deadline deadline, uint64_t* sender);

// Prefill side, for a request that ended before any put to `id` (cancelled, failed): tells the receiver its
// ranges are free (a completion with status kCompletionWithdrawn).
Status send_withdrawal(Endpoint& ep, uint64_t id, Deadline deadline);

// Prefill side, while the request of transfer `id` waits or runs before its puts: tells the receiver it holds the
// request and its destinations (kQueued), which renews the receiver's deadline.
Status send_queued(Endpoint& ep, uint64_t id, Deadline deadline);

// Decode side, for transfer `id` that was never advertised (the request ended or was cancelled first): tells the
// sender to drop its request.
Status send_cancel(Endpoint& ep, uint64_t id, CancelReason reason, Deadline deadline);

class OutgoingTransfer {
 public:
  // sources[i] is written to destinations.ranges[i]; the lengths must match one for one. The byte stream of the
  // ranges is announced in segments of segment_bytes (the last one shorter; a range may span segments).
  OutgoingTransfer(uint64_t id, Endpoint& ep, Destinations destinations,
                   std::vector<std::span<const std::byte>> sources, size_t segment_bytes = kDefaultSegmentBytes);

  // kCreated → kPosted → kFlushed → kCompleted; kFailed on any error; kCancelled when the receiver's kCancel for
  // this id came before the last put (the puts posted are flushed, then a completion with status cancelled is
  // sent; run() returns kUnavailable naming the cancel, the endpoint stays open). A failure after the destinations arrived
  // (mismatched ranges, a bad rkey, a failed put) is reported to the peer by a completion with a non-zero status
  // while the endpoint is still usable. When run() returns, no UCX request reads the sources any more. A positive
  // `lease` holds the sources only while the peer is heard from (put.h): a silent peer fails it ("lease expired").
  Status run(Deadline deadline, std::chrono::milliseconds lease = std::chrono::milliseconds(0));

  TransferState state() const { return state_; }

 private:
  Status fail(Status reason, Deadline deadline);

  uint64_t id_;
  Endpoint& ep_;
  Destinations destinations_;
  std::vector<std::span<const std::byte>> sources_;
  size_t segment_bytes_;
  TransferState state_ = TransferState::kCreated;
};

}  // namespace kestrel::disagg
