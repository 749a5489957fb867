// Control messages between a prefill and a decode instance, sent as UCX active messages (one AM id per kind).
// Explicit little-endian layout, checked on decode; every message starts with the same header:
//
//   u32 magic 'KDSG' | u16 version | u16 kind | u64 sender instance | u32 sender pid | u64 transfer id
//
//   kDestinations (decode → prefill): u32 rkey count, per rkey (u32 length, bytes); u32 range count, per range
//                 (u64 remote address, u64 length, u32 rkey index)
//   kSegment      (prefill → decode, after a segment's puts are flushed): u32 segment index, u64 offset, u64
//                 length, u64 checksum (checksum.h) of the segment's source bytes. The ranges, laid end to end in
//                 their order, form one byte stream; segment k covers [offset, offset + length) of it, and the
//                 segments follow each other in order without gaps, so the receiver verifies each one as soon as
//                 it is announced, while the next is being written
//   kCompletion   (prefill → decode, after the last segment): u32 status (0 = every range put, else the
//                 sender gave up after the destinations arrived, 2 = withdrawn: the sender's request ended before
//                 any put and none will come, the ranges are free), u32 range count, u64 total bytes, u32 segment
//                 count, u64 checksum (checksum.h) of the segments' checksums (each a u64, little-endian, in order)
//                 (3 = cancelled: the sender stopped at the receiver's kCancel, every put it issued was flushed
//                 before this message and none will follow, the ranges are free)
//   kHeartbeat    (both ways, periodic): empty body
//   kCancel       (decode → prefill): u32 reason (1 = the decode's client cancelled, 2 = the decode's request
//                 ended otherwise before its state arrived). The prefill stops the transfer of that id (or never
//                 starts it) and releases its request; a transfer already under way is answered with a completion
//                 of status 3 once its puts are flushed
//   kQueued       (prefill → decode, periodic): empty body. The prefill holds the request of this transfer id (its
//                 prompt queued or running) and has the destinations: it will put, withdraw or fail it. Each
//                 notice renews the receiver's deadline, so a prefill's queue, not only its transfer, may take
//                 longer than the deadline
//
// Version 5: kQueued (version 4 added kCancel and completion status 3, version 3 had no cancel from the decode
// side, version 2 one checksum of the whole payload in the completion, version 1 FNV-1a).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/result.h"

namespace kestrel::disagg {

enum class MessageKind : uint16_t {
  kDestinations = 1,
  kCompletion = 2,
  kHeartbeat = 3,
  kSegment = 4,
  kCancel = 5,
  kQueued = 6
};
inline constexpr uint16_t kMaxMessageKind = 6;

struct MessageHeader {
  MessageKind kind = MessageKind::kHeartbeat;
  uint64_t sender = 0;       // instance id of the sending worker (WorkerOptions::instance)
  uint32_t pid = 0;          // the sending process (meaningful to a peer on the same host only)
  uint64_t transfer_id = 0;  // 0 for heartbeats
};

struct RemoteRange {
  uint64_t address = 0;  // in the receiver's registered memory
  uint64_t length = 0;
  uint32_t rkey = 0;  // index into Destinations::rkeys
};

struct Destinations {
  std::vector<std::vector<std::byte>> rkeys;  // packed remote keys (Region::packed_rkey), one per registered pool
  std::vector<RemoteRange> ranges;            // in the order the sender's sources are listed
};

inline constexpr uint32_t kCompletionFailed = 1;
inline constexpr uint32_t kCompletionWithdrawn = 2;
inline constexpr uint32_t kCompletionCancelled = 3;

// Why the decode side calls a transfer off (kCancel).
enum class CancelReason : uint32_t { kClient = 1, kEnded = 2 };
inline constexpr uint32_t kMaxCancelReason = 2;
const char* to_string(CancelReason r);

struct Segment {
  uint32_t index = 0;
  uint64_t offset = 0;  // into the transfer's byte stream (its ranges end to end)
  uint64_t length = 0;
  uint64_t checksum = 0;  // of the source bytes [offset, offset + length)
};

struct Completion {
  uint32_t status = 0;  // 0: every range was put and flushed; kCompletionWithdrawn: nothing was put and nothing
                        // will be; kCompletionCancelled: stopped at the receiver's cancel, what was put is
                        // flushed, nothing follows; otherwise the sender failed and the data is invalid
  uint32_t ranges = 0;
  uint64_t bytes = 0;
  uint32_t segments = 0;
  uint64_t checksum = 0;  // of the segments' checksums (segment_digest)
};

// The completion's checksum: XXH3-64 over the segments' checksums, each as 8 little-endian bytes, in order.
class SegmentDigest {
 public:
  void add(uint64_t segment_checksum);
  uint64_t value() const;

 private:
  std::vector<std::byte> bytes_;
};

// Limits a decoder enforces before allocating anything.
inline constexpr size_t kMaxRanges = size_t{1} << 22;
inline constexpr size_t kMaxRkeys = 4096;
inline constexpr size_t kMaxRkeyBytes = 64 * 1024;

// The sender's pid is this process's (getpid()).
std::vector<std::byte> encode_heartbeat(uint64_t sender);
std::vector<std::byte> encode_queued(uint64_t sender, uint64_t transfer_id);
std::vector<std::byte> encode_destinations(uint64_t sender, uint64_t transfer_id, const Destinations& d);
std::vector<std::byte> encode_segment(uint64_t sender, uint64_t transfer_id, const Segment& s);
std::vector<std::byte> encode_completion(uint64_t sender, uint64_t transfer_id, const Completion& c);
std::vector<std::byte> encode_cancel(uint64_t sender, uint64_t transfer_id, CancelReason reason);

// Splits a message into its header and body; kCorrupt for a bad magic, version, kind or a short buffer.
Result<MessageHeader> decode_header(std::span<const std::byte> message, std::span<const std::byte>* body);
// Bodies; kCorrupt for anything truncated, trailing, out of the limits above, or an rkey index out of range.
Result<Destinations> decode_destinations(std::span<const std::byte> body);
Result<Segment> decode_segment(std::span<const std::byte> body);  // also kCorrupt for an empty or wrapping segment
Result<Completion> decode_completion(std::span<const std::byte> body);
Result<CancelReason> decode_cancel(std::span<const std::byte> body);  // also kCorrupt for an unknown reason

}  // namespace kestrel::disagg
