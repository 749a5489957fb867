// Latency and bandwidth of the dist/ collectives on Open MPI. Run under mpiexec (docs/PERFORMANCE.md,
// "Collectives (dist/)"); rank 0 prints a markdown table.
//
// `size` is the buffer every rank ends with: all_reduce_sum reduces `size` bytes of floats; all_gather_v gathers
// size/N bytes from each rank; all_to_all_v sends size/N bytes to each rank (itself included). Time per call
// = the slowest rank's wall time over `iters` back-to-back calls (after 2 warm-up calls), divided by iters;
// bandwidth = size / time per call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "dist/mpi_communicator.h"

namespace {

using kestrel::dist::Communicator;

double time_per_call(Communicator& comm, int iters, const std::function<kestrel::Status()>& call) {
  for (int i = 0; i < 2; ++i)
    if (!call().is_ok()) std::abort();
  if (!comm.barrier().is_ok()) std::abort();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    if (!call().is_ok()) std::abort();
  const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all(comm.size());
  std::vector<size_t> ones(comm.size(), 1);
  if (!comm.all_gather_v<double>(std::span<const double>(&mine, 1), all, ones).is_ok()) std::abort();
  return *std::max_element(all.begin(), all.end()) / iters;
}

}  // namespace

int main(int argc, char** argv) {
  auto created = kestrel::dist::MpiCommunicator::create_world(&argc, &argv);
  if (!created) {
    std::fprintf(stderr, "%s\n", created.error().message().c_str());
    return 1;
  }
  Communicator& comm = *created.value();
  const int n = comm.size();
  if (comm.rank() == 0) {
    std::printf("ranks %d\n\n| size | all_reduce_sum µs | GB/s | all_gather_v µs | GB/s | all_to_all_v µs | GB/s |\n", n);
    std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  for (size_t size = 8; size <= (size_t{16} << 20); size *= 8) {
    const int iters = static_cast<int>(std::clamp<size_t>((size_t{32} << 20) / size, 5, 2000));
    std::vector<float> reduce(size / sizeof(float), 1.0f);
    const size_t part = std::max<size_t>(size / n, 1);
    std::vector<std::byte> send(part), recv(part * n), a2a_send(part * n);
    std::vector<size_t> counts(n, part), displs(n);
    for (int r = 0; r < n; ++r) displs[r] = static_cast<size_t>(r) * part;
    const double t_reduce = time_per_call(comm, iters, [&] { return comm.all_reduce_sum(reduce); });
    const double t_gather = time_per_call(comm, iters, [&] {
      return comm.all_gather_v_bytes(send, recv, counts, displs);
    });
    const double t_a2a = time_per_call(comm, iters, [&] {
      return comm.all_to_all_v_bytes(a2a_send, counts, displs, recv, counts, displs);
    });
    if (comm.rank() == 0) {
      auto row = [&](double t) { std::printf(" %.1f | %.3f |", t * 1e6, static_cast<double>(size) / t / 1e9); };
      if (size < 1024) std::printf("| %zu B |", size);
      else if (size < (size_t{1} << 20)) std::printf("| %zu KiB |", size >> 10);
      else std::printf("| %zu MiB |", size >> 20);
      row(t_reduce);
      row(t_gather);
      row(t_a2a);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
