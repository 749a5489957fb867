// RegionRegistry: which byte ranges of registered memory have been advertised to a peer, and whether they may be
// reused. A range is held from advertise() until either its transfer's completion is proven (complete(): sizes
// and checksum matched) or the endpoint it was advertised through has been closed (release_closed()). A transfer
// that failed or was abandoned keeps its ranges quarantined until then: a peer that is slow, frozen or
// misbehaving may still write into them, and only a closed endpoint stops that. Overlapping advertisements are
// refused, so held memory is never handed to a second transfer. Counters make leaks visible.
//
// Closing stops writes that go through this process's UCX (tcp; shared-memory transports that deliver through
// the receiver's progress). With cross-memory attach (UCX's cma) a writer that is still alive writes directly
// into this process; the caller then must not release before the peer process is known to be gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "disagg/endpoint.h"

namespace kestrel::disagg {

struct HeldRange {
  const std::byte* base = nullptr;
  size_t length = 0;
};

struct RegistryCounts {
  size_t in_flight = 0;    // transfers advertised, neither completed nor failed
  size_t quarantined = 0;  // transfers failed, their endpoint not yet closed
  size_t held_ranges = 0;  // ranges held by the two above
  uint64_t completed = 0;
  uint64_t failed = 0;                // transfers ever quarantined
  uint64_t released_after_close = 0;  // transfers (quarantined or still in flight) released by release_closed
};

class RegionRegistry {
 public:
  // kInvalidArgument for a transfer id in use, an empty or zero-length range, or overlap with any held range
  // (nothing is recorded then).
  Status advertise(uint64_t transfer_id, uint64_t endpoint_id, std::span<const HeldRange> ranges);
  // Completion proven: the ranges are free. kInvalidArgument unless the transfer is in flight.
  Status complete(uint64_t transfer_id);
  // The transfer failed: its ranges stay held (quarantine). No-op for a transfer already failed.
  Status fail(uint64_t transfer_id);
  // The peer behind `ep` can no longer write (!ep.peer_may_write()): every transfer advertised through it (failed,
  // or still in flight, which counts as failed) is released. kUnavailable, releasing nothing, otherwise.
  Status release_closed(const Endpoint& ep);

  bool held(const void* p, size_t n) const;
  RegistryCounts counts() const;

 private:
  struct Transfer {
    uint64_t endpoint = 0;
    bool failed = false;
    std::vector<HeldRange> ranges;
  };
  void drop(std::unordered_map<uint64_t, Transfer>::iterator it);

  std::unordered_map<uint64_t, Transfer> transfers_;
  std::map<uintptr_t, uintptr_t> held_;  // start → end (exclusive), non-overlapping
  RegistryCounts counts_;
};

}  // namespace kestrel::disagg
