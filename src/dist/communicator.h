// Communicator: the collectives the ranks of one cell use (docs/architecture.md, "dist/").
//
// Backends implement four byte-level primitives (all_gather_v, all_to_all_v, broadcast, barrier). The
// floating-point reductions are built here, once, on top of them, so every backend (MPI, the in-process fake)
// sums in the same order and gives the same bits:
//
//   result[i] = (((x_0[i] + x_1[i]) + x_2[i]) + ... ) + x_{N-1}[i]      (fp32, rank order, left to right)
//
// We do not use MPI_Allreduce / MPI_Reduce_scatter with MPI_SUM: the MPI standard leaves the order of the
// operands to the implementation (Open MPI picks ring, recursive doubling, ... by message size and rank
// count), and fp32 addition is not associative, so such a sum can change with the rank count, the message
// size, or the library version. A model replica must produce the same logits as a single process that adds
// the rank contributions serially, run after run.
//
// Every rank must call the same collectives in the same order with matching sizes (as in MPI). Calls are made
// from one thread at a time per rank (MPI_THREAD_SERIALIZED), not necessarily the one that created it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "base/result.h"

namespace kestrel::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // ---- Byte primitives (implemented by each backend). Counts and displacements are in bytes, indexed by rank.
  // Each rank contributes `send` (possibly empty); rank r's contribution lands at recv + recv_displs[r] and must
  // be exactly recv_counts[r] bytes long.
  virtual Status all_gather_v_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                    std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) = 0;
  // Rank r sends send[send_displs[p] .. +send_counts[p]) to every rank p and receives recv_counts[p] bytes
  // from p at recv + recv_displs[p]. send_counts[p] on rank r must equal recv_counts[r] on rank p.
  virtual Status all_to_all_v_bytes(std::span<const std::byte> send, std::span<const size_t> send_counts,
                                    std::span<const size_t> send_displs, std::span<std::byte> recv,
                                    std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) = 0;
  // Copies root's `data` into every rank's `data` (same length everywhere).
  virtual Status broadcast_bytes(std::span<std::byte> data, int root) = 0;
  virtual Status barrier() = 0;

  // ---- Deterministic fp32 reductions (rank-order sums, see the top of this file).
  // In place: every rank ends with the element-wise sum over ranks of its `data` (same length everywhere).
  Status all_reduce_sum(std::span<float> data);
  // send holds sum(counts) floats on every rank; rank r receives into recv (counts[r] floats) the rank-order
  // sum of block r, block r being send[sum(counts[0..r)) .. +counts[r]).
  Status reduce_scatter_sum(std::span<const float> send, std::span<float> recv, std::span<const size_t> counts);

  // ---- Typed wrappers (trivially copyable T; counts and displacements in elements).
  template <typename T>
  Status all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const size_t> recv_counts,
                      std::span<const size_t> recv_displs);
  // Packed layout: rank r's block follows rank r-1's.
  template <typename T>
  Status all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const size_t> recv_counts);
  template <typename T>
  Status all_to_all_v(std::span<const T> send, std::span<const size_t> send_counts,
                      std::span<const size_t> send_displs, std::span<T> recv, std::span<const size_t> recv_counts,
                      std::span<const size_t> recv_displs);
  template <typename T>
  Status broadcast(std::span<T> data, int root);

  // Inputs shorter than this many floats per rank go through one all_gather + a local ordered sum (one round
  // trip); longer ones through reduce-scatter + all_gather, so each rank sends about 2·(N-1)/N of the vector
  // instead of (N-1) times it. Both paths add in the same order, so the bits do not depend on the choice.
  static constexpr size_t kAllReduceGatherMaxFloats = 4096;

 private:
  Status check_counts(std::span<const size_t> counts, const char* what) const;
  // Scratch for the reductions, kept between calls so a steady decode loop does not allocate.
  std::vector<float> scratch_;
  std::vector<size_t> scratch_counts_;
};

// Element counts → byte counts, refusing sizes whose byte length would not fit size_t.
Status to_bytes(std::span<const size_t> elems, size_t elem_size, std::vector<size_t>& bytes);

template <typename T>
Status Communicator::all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const size_t> recv_counts,
                                  std::span<const size_t> recv_displs) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<size_t> counts, displs;
  KESTREL_RETURN_IF_ERROR(to_bytes(recv_counts, sizeof(T), counts));
  KESTREL_RETURN_IF_ERROR(to_bytes(recv_displs, sizeof(T), displs));
  return all_gather_v_bytes(std::as_bytes(send), std::as_writable_bytes(recv), counts, displs);
}

template <typename T>
Status Communicator::all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const size_t> recv_counts) {
  std::vector<size_t> displs(recv_counts.size());
  size_t at = 0;
  for (size_t r = 0; r < recv_counts.size(); ++r) {
    displs[r] = at;
    at += recv_counts[r];
  }
  return all_gather_v(send, recv, recv_counts, std::span<const size_t>(displs));
}

template <typename T>
Status Communicator::all_to_all_v(std::span<const T> send, std::span<const size_t> send_counts,
                                  std::span<const size_t> send_displs, std::span<T> recv,
                                  std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<size_t> sc, sd, rc, rd;
  KESTREL_RETURN_IF_ERROR(to_bytes(send_counts, sizeof(T), sc));
  KESTREL_RETURN_IF_ERROR(to_bytes(send_displs, sizeof(T), sd));
  KESTREL_RETURN_IF_ERROR(to_bytes(recv_counts, sizeof(T), rc));
  KESTREL_RETURN_IF_ERROR(to_bytes(recv_displs, sizeof(T), rd));
  return all_to_all_v_bytes(std::as_bytes(send), sc, sd, std::as_writable_bytes(recv), rc, rd);
}

template <typename T>
Status Communicator::broadcast(std::span<T> data, int root) {
  static_assert(std::is_trivially_copyable_v<T>);
  return broadcast_bytes(std::as_writable_bytes(data), root);
}

// Checks that counts/displacements (bytes, one per rank) describe blocks inside a buffer of `buffer_bytes`.
Status check_layout(std::span<const size_t> counts, std::span<const size_t> displs, size_t buffer_bytes, int nranks,
                    const char* what);

}  // namespace kestrel::dist
