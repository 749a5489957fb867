// FaultPolicy: faults injected inside the transport so tests can drop, corrupt or delay a put, drop a control
// message, or stall a worker's progress (the kernels this runs on have no tc netem). Production code passes no
// policy (nullptr); only tests implement one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace kestrel::disagg {

struct PutFault {
  enum class Kind {
    kNone,     // post the put as asked
    kDrop,     // post nothing for this range (the transfer still looks sent and flushed)
    kCorrupt,  // put from a private copy of the source with byte `byte` flipped (bitwise not)
    kDelay,    // sleep `delay` before posting the put (a slow sender)
  };
  Kind kind = Kind::kNone;
  size_t byte = 0;
  std::chrono::milliseconds delay{0};
};

class FaultPolicy {
 public:
  virtual ~FaultPolicy() = default;
  // Called once per range before its put is posted; `index` counts ranges within the transfer.
  virtual PutFault on_put(uint64_t transfer_id, size_t index, size_t length) = 0;
  // Called before a control message (kind, see messages.h) is sent; true drops it silently.
  virtual bool drop_message(uint16_t kind) = 0;
  // Called on every progress call of the worker that holds the policy; true skips UCX progress (a frozen process).
  virtual bool stall_progress() = 0;
  // Called right before UCX unpacks a peer's remote key, after the peer's liveness check (Endpoint::unpack_rkey):
  // a test kills the peer here.
  virtual void before_rkey_unpack() {}
};

}  // namespace kestrel::disagg
