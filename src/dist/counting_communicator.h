// CountingCommunicator: forwards every collective to another Communicator and counts the bytes this rank
// handed over for other ranks (its own block of an all_to_all_v / all_gather_v is a local copy and is not
// counted; a broadcast root counts its buffer once per receiving rank). The cell's bench reports these
// measured bytes next to the bytes the cell computes from its plans and routing (docs/cell.md).
#pragma once

#include <cstdint>

#include "dist/communicator.h"

namespace kestrel::dist {

class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Status all_gather_v_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                            std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) override {
    sent_bytes_ += static_cast<uint64_t>(send.size()) * static_cast<uint64_t>(size() - 1);
    ++calls_;
    return inner_.all_gather_v_bytes(send, recv, recv_counts, recv_displs);
  }
  Status all_to_all_v_bytes(std::span<const std::byte> send, std::span<const size_t> send_counts,
                            std::span<const size_t> send_displs, std::span<std::byte> recv,
                            std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) override {
    for (size_t p = 0; p < send_counts.size(); ++p)
      if (static_cast<int>(p) != rank()) sent_bytes_ += send_counts[p];
    ++calls_;
    return inner_.all_to_all_v_bytes(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  }
  Status broadcast_bytes(std::span<std::byte> data, int root) override {
    if (root == rank()) sent_bytes_ += static_cast<uint64_t>(data.size()) * static_cast<uint64_t>(size() - 1);
    ++calls_;
    return inner_.broadcast_bytes(data, root);
  }
  Status barrier() override {
    ++calls_;
    return inner_.barrier();
  }

  uint64_t sent_bytes() const { return sent_bytes_; }
  uint64_t calls() const { return calls_; }

 private:
  Communicator& inner_;
  uint64_t sent_bytes_ = 0;
  uint64_t calls_ = 0;
};

}  // namespace kestrel::dist
