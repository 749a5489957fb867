#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "dist/large_count.h"

namespace kestrel::dist {
namespace {

// Communicators alive that were created by the call that initialised MPI; the last one finalises it.
int g_owned_communicators = 0;
bool g_we_initialised = false;

Status mpi_error(int rc, const char* call, int rank, int size) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = std::snprintf(text, sizeof text, "error %d", rc);
  return {StatusCode::kInternal, std::string("dist: ") + call + " failed on rank " + std::to_string(rank) + " of " +
                                     std::to_string(size) + ": " + std::string(text, len)};
}

// Tag for the pieces of exchange(); point-to-point traffic never matches collective traffic in MPI.
constexpr int kPieceTag = 0x4b53;

}  // namespace

struct MpiCommunicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  MpiOptions options;
  bool owns_mpi = false;
  // Scratch kept between calls: int argument arrays, requests, staging for a local displacement overflow.
  std::vector<int> counts, displs;
  std::vector<MPI_Request> requests;
  std::vector<const std::byte*> send_ptrs;
  std::vector<std::byte*> recv_ptrs;
  std::vector<size_t> send_bytes;
  std::vector<std::byte> staging;
};

#define KESTREL_MPI_CALL(call, ...)                                           \
  do {                                                                        \
    const int _rc = call(__VA_ARGS__);                                        \
    if (_rc != MPI_SUCCESS) return mpi_error(_rc, #call, rank_, size_);       \
  } while (0)

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create_world(int* argc, char*** argv, MpiOptions options) {
  if (options.max_count == 0 || options.max_count > static_cast<size_t>(INT_MAX))
    return invalid_argument("dist: MpiOptions::max_count must be in [1, INT_MAX]");
  int initialised = 0;
  MPI_Initialized(&initialised);
  bool owns = false;
  if (!initialised) {
    int provided = 0;
    // SERIALIZED: compute threads (OpenMP) never call MPI, and one thread at a time does; that thread need not be
    // the one that initialised MPI (serve's scheduler thread steps the cell while the main thread waits for
    // signals).
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Init_thread", -1, -1);
    if (provided < MPI_THREAD_SERIALIZED)
      return unsupported("dist: MPI provides thread level " + std::to_string(provided) + ", need SERIALIZED");
    g_we_initialised = true;
  }
  if (g_we_initialised) owns = true;
  // Errors on MPI_COMM_WORLD itself (e.g. in MPI_Comm_dup) must return too, not abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm);
  if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Comm_dup", -1, -1);
  rc = MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Comm_set_errhandler", -1, -1);
  int rank = 0, size = 0;
  MPI_Comm_rank(impl->comm, &rank);
  MPI_Comm_size(impl->comm, &size);
  impl->owns_mpi = owns;
  if (owns) ++g_owned_communicators;
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(impl), rank, size));
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<Impl> impl, int rank, int size)
    : impl_(std::move(impl)), rank_(rank), size_(size) {}

MpiCommunicator::~MpiCommunicator() {
  MPI_Comm_free(&impl_->comm);
  if (impl_->owns_mpi && --g_owned_communicators == 0) {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
  }
}

void MpiCommunicator::abort_job(int code) {
  MPI_Abort(impl_->comm, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever did
}

Status MpiCommunicator::exchange(const char* op, std::span<const std::byte* const> send,
                                 std::span<const size_t> send_bytes, std::span<std::byte* const> recv,
                                 std::span<const size_t> recv_bytes) {
  const size_t limit = impl_->options.max_count;
  // Checked before anything is posted, so an error leaves no request in flight on this rank.
  if (send_bytes[rank_] != recv_bytes[rank_])
    return invalid_argument(std::string("dist: ") + op + ": rank " + std::to_string(rank_) + " sends itself " +
                            std::to_string(send_bytes[rank_]) + " bytes but expects " +
                            std::to_string(recv_bytes[rank_]));
  auto& reqs = impl_->requests;
  reqs.clear();
  // Receives first, so that eager sends find a posted buffer; pieces of one peer are posted in order and MPI
  // keeps the order of messages between one pair with one tag, so piece i lands at offset i·limit.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    for (size_t i = 0, n = piece_count(recv_bytes[p], limit); i < n; ++i) {
      const Piece pc = piece(recv_bytes[p], limit, i);
      reqs.emplace_back();
      const int rc = MPI_Irecv(recv[p] + pc.offset, static_cast<int>(pc.bytes), MPI_BYTE, p, kPieceTag, impl_->comm,
                               &reqs.back());
      if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Irecv", rank_, size_);
    }
  }
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;  // staggered, so not every rank sends to rank 0 first
    for (size_t i = 0, n = piece_count(send_bytes[p], limit); i < n; ++i) {
      const Piece pc = piece(send_bytes[p], limit, i);
      reqs.emplace_back();
      const int rc = MPI_Isend(send[p] + pc.offset, static_cast<int>(pc.bytes), MPI_BYTE, p, kPieceTag, impl_->comm,
                               &reqs.back());
      if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Isend", rank_, size_);
    }
  }
  if (send_bytes[rank_] > 0 && send[rank_] != recv[rank_])
    std::memmove(recv[rank_], send[rank_], send_bytes[rank_]);
  KESTREL_MPI_CALL(MPI_Waitall, static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  return Status::ok();
}

Status MpiCommunicator::all_gather_v_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                           std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) {
  KESTREL_RETURN_IF_ERROR(check_layout(recv_counts, recv_displs, recv.size(), size_, "all_gather_v"));
  if (send.size() != recv_counts[rank_])
    return invalid_argument("dist: all_gather_v: rank " + std::to_string(rank_) + " sends " +
                            std::to_string(send.size()) + " bytes, its count says " +
                            std::to_string(recv_counts[rank_]));
  const size_t limit = impl_->options.max_count;
  // recv_counts are the same on every rank, so every rank takes the same path.
  size_t total = 0;
  for (size_t c : recv_counts) total += c;
  if (total > limit) {
    // Pieces over point-to-point: every peer gets this rank's whole block.
    impl_->send_ptrs.assign(size_, send.data());
    impl_->send_bytes.assign(size_, send.size());
    impl_->recv_ptrs.resize(size_);
    for (int p = 0; p < size_; ++p) impl_->recv_ptrs[p] = recv.data() + recv_displs[p];
    return exchange("all_gather_v", impl_->send_ptrs, impl_->send_bytes, impl_->recv_ptrs, recv_counts);
  }
  // One MPI_Allgatherv. Counts fit (total <= limit); displacements are local and may not: then receive packed
  // into staging (its displacements are prefix sums <= total) and move the blocks into place.
  const bool displs_fit = all_fit(recv_displs, limit);
  std::byte* base = recv.data();
  auto& counts = impl_->counts;
  auto& displs = impl_->displs;
  counts.resize(size_);
  displs.resize(size_);
  size_t at = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = static_cast<int>(recv_counts[r]);
    displs[r] = static_cast<int>(displs_fit ? recv_displs[r] : at);
    at += recv_counts[r];
  }
  if (!displs_fit) {
    impl_->staging.resize(total);
    base = impl_->staging.data();
  }
  KESTREL_MPI_CALL(MPI_Allgatherv, send.data(), static_cast<int>(send.size()), MPI_BYTE, base, counts.data(),
                   displs.data(), MPI_BYTE, impl_->comm);
  if (!displs_fit)
    for (int r = 0; r < size_; ++r)
      if (recv_counts[r] > 0) std::memcpy(recv.data() + recv_displs[r], base + displs[r], recv_counts[r]);
  return Status::ok();
}

Status MpiCommunicator::all_to_all_v_bytes(std::span<const std::byte> send, std::span<const size_t> send_counts,
                                           std::span<const size_t> send_displs, std::span<std::byte> recv,
                                           std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) {
  KESTREL_RETURN_IF_ERROR(check_layout(send_counts, send_displs, send.size(), size_, "all_to_all_v (send)"));
  KESTREL_RETURN_IF_ERROR(check_layout(recv_counts, recv_displs, recv.size(), size_, "all_to_all_v (recv)"));
  // Always point-to-point (what Open MPI's own alltoallv does for small rank counts: linear or pairwise
  // isend/irecv). A rank knows only its own row of the count matrix, so it could not tell whether a peer needs
  // pieces and MPI_Alltoallv would need every rank to agree; the message between two ranks has the same size
  // at both ends, so each pair splits it identically on its own.
  impl_->send_ptrs.resize(size_);
  impl_->recv_ptrs.resize(size_);
  for (int p = 0; p < size_; ++p) {
    impl_->send_ptrs[p] = send.data() + send_displs[p];
    impl_->recv_ptrs[p] = recv.data() + recv_displs[p];
  }
  return exchange("all_to_all_v", impl_->send_ptrs, send_counts, impl_->recv_ptrs, recv_counts);
}

Status MpiCommunicator::broadcast_bytes(std::span<std::byte> data, int root) {
  // The length is the same on every rank, so all ranks cut the same pieces.
  const size_t limit = impl_->options.max_count;
  const size_t n = piece_count(data.size(), limit);
  if (n == 0) KESTREL_MPI_CALL(MPI_Bcast, data.data(), 0, MPI_BYTE, root, impl_->comm);  // still checks root
  for (size_t i = 0; i < n; ++i) {
    const Piece pc = piece(data.size(), limit, i);
    KESTREL_MPI_CALL(MPI_Bcast, data.data() + pc.offset, static_cast<int>(pc.bytes), MPI_BYTE, root, impl_->comm);
  }
  return Status::ok();
}

Status MpiCommunicator::barrier() {
  KESTREL_MPI_CALL(MPI_Barrier, impl_->comm);
  return Status::ok();
}

}  // namespace kestrel::dist
