// Checksum of a transfer's bytes: XXH3-64 (xxHash, seed 0) over the ranges in order, as if they were one buffer.
// Computed by the sender over its sources and by the receiver over its destinations after the completion message
// arrives; equal values (with equal sizes) are the proof that every range landed. Detects dropped and corrupted
// puts; it is not a defence against a malicious peer. Tens of GB/s on one core (vectorised), so it stays small
// next to the copy itself; the byte-at-a-time FNV-1a of protocol version 1 ran at about 1 GB/s and was most of a
// hand-off's time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kestrel::disagg {

class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;

  void update(std::span<const std::byte> bytes);
  uint64_t value() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kestrel::disagg
