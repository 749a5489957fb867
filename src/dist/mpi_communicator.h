// MpiCommunicator: the Communicator over Open MPI (library target kestrel_dist_mpi; nothing else links MPI,
// and this header does not include <mpi.h>).
//
// Failure behaviour: the communicator runs with MPI_ERRORS_RETURN, so a failing MPI call becomes a Status naming
// the call and the rank instead of the default abort. After such an error the collective state of the job is
// unknown (peers may be blocked in the same call), so the caller must end the process: return a non-zero exit
// status or call abort_job(). Open MPI 4.1 has no fault tolerance (ULFM arrives in 5.0): a rank that dies is
// not survivable; mpirun ends the whole job when a rank is killed or exits non-zero (docs/architecture.md,
// "dist/").
#pragma once

#include <climits>
#include <memory>

#include "dist/communicator.h"

namespace kestrel::dist {

struct MpiOptions {
  // Largest count or displacement (bytes) handed to one MPI call; bigger transfers go in pieces
  // (dist/large_count.h). Must be equal on every rank. Tests lower it to exercise the piecewise paths.
  size_t max_count = INT_MAX;
};

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI if needed (MPI_THREAD_SERIALIZED: one thread at a time talks to MPI, not necessarily the one
  // that initialised it; MPI is finalised on the initialising thread) and wraps a duplicate
  // of MPI_COMM_WORLD with MPI_ERRORS_RETURN. MPI is finalised when the last communicator that initialised it
  // is destroyed.
  static Result<std::unique_ptr<MpiCommunicator>> create_world(int* argc, char*** argv, MpiOptions options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_gather_v_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                            std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) override;
  Status all_to_all_v_bytes(std::span<const std::byte> send, std::span<const size_t> send_counts,
                            std::span<const size_t> send_displs, std::span<std::byte> recv,
                            std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) override;
  Status broadcast_bytes(std::span<std::byte> data, int root) override;
  Status barrier() override;

  // Ends every rank of the job now (MPI_Abort): the way out after an error in a collective.
  [[noreturn]] void abort_job(int code);

 private:
  struct Impl;
  MpiCommunicator(std::unique_ptr<Impl> impl, int rank, int size);
  // Point-to-point exchange of one block per peer, each in pieces of at most max_count bytes.
  Status exchange(const char* op, std::span<const std::byte* const> send, std::span<const size_t> send_bytes,
                  std::span<std::byte* const> recv, std::span<const size_t> recv_bytes);

  std::unique_ptr<Impl> impl_;
  int rank_;
  int size_;
};

}  // namespace kestrel::dist
