// Checksum of a transfer's bytes: 64-bit FNV-1a over the ranges in order, as if they were one buffer. Computed by
// the sender over its sources and by the receiver over its destinations after the completion message arrives;
// equal values (with equal sizes) are the proof that every range landed. Detects dropped and corrupted puts; it is
// not a defence against a malicious peer. Byte-at-a-time (about 1 GB/s on one core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kestrel::disagg {

class Checksum {
 public:
  void update(std::span<const std::byte> bytes) {
    for (std::byte b : bytes) {
      h_ ^= static_cast<uint64_t>(b);
      h_ *= 0x100000001b3ull;
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace kestrel::disagg
