// put_and_flush: one-sided writes of many (local source, remote address, rkey, length) ranges into a peer's
// registered memory, then an endpoint flush: when it returns Ok every byte is in the peer's memory (remote
// completion), so a control message sent afterwards on the same endpoint announces finished data. Optionally in
// segments: after a segment's puts are posted an endpoint flush is posted for it (without waiting), and the
// caller hears when each segment's flush completes (in order) while the next segments' puts go on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/result.h"
#include "disagg/deadline.h"
#include "disagg/endpoint.h"
#include "disagg/memory.h"

namespace kestrel::disagg {

struct PutRange {
  const std::byte* source = nullptr;  // local; need not be registered
  uint64_t remote = 0;                // address inside the peer's region that `rkey` covers
  size_t length = 0;
  const RemoteKey* rkey = nullptr;
};

// Posts every put, then flushes the endpoint, all within the deadline. The fault policy of the endpoint's worker
// (if any) sees each range first (drop, corrupt a private copy, delay). On any failure (an endpoint error, a
// missed deadline) the endpoint is marked failed and closed (up to one second) before returning. The sources may
// be reused once this returns Ok, or once ep.closed() after a failure (with PeerFailure::kUcx always on return:
// the forced close completes every request).
//
// Lease: with a positive `lease` and a known peer (Endpoint::peer), the sources are held only while the peer
// shows it is alive: every message from it (heartbeats included) renews the lease, and a peer silent for longer
// (frozen, gone) fails the call with kUnavailable "lease expired" (checked after each put and while flushing; a
// put delayed by the fault policy is checked after the delay, once the worker has progressed).
Status put_and_flush(Endpoint& ep, uint64_t transfer_id, std::span<const PutRange> ranges, Deadline deadline,
                     std::chrono::milliseconds lease = std::chrono::milliseconds(0));

// The ranges cut into consecutive segments: segment k is ranges [ends[k-1], ends[k]) (ends ascending, the last
// one ranges.size()). posted(k) runs once segment k's puts are posted (its sources may still be read by UCX;
// they must not change), flushed(k) once every byte of segment k is in the peer's memory; flushed() runs in
// segment order, always after posted() of the same segment, and a non-Ok status from either fails the call as
// an endpoint failure would.
//
// stop() (optional) is asked before each put: once it returns true no further put is posted and no further
// segment is reported; the puts already posted are flushed (remote completion) and the call returns Ok, so the
// peer may reuse the memory once told. A failure while flushing fails the call as usual.
//
// window (optional, 0: no bound): at most this many segments are posted and not yet flushed; the puts of the next
// one wait (progressing the worker: heartbeats out, messages in, lease and stop checked) for the oldest flush.
// Over one tcp connection whatever this side sends after its puts (its heartbeats, the segment announcements)
// waits behind every put posted before it, so without a bound a slow link delays them by the whole transfer.
struct Segments {
  std::vector<size_t> ends;
  std::function<Status(size_t)> posted, flushed;
  std::function<bool()> stop;
  size_t window = 0;
};

// put_and_flush in segments: the same contract, faults (`index` counts puts within the call) and lease.
Status put_and_flush(Endpoint& ep, uint64_t transfer_id, std::span<const PutRange> ranges, const Segments& segments,
                     Deadline deadline, std::chrono::milliseconds lease = std::chrono::milliseconds(0));

}  // namespace kestrel::disagg
