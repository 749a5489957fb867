// Rank program for dist_mpi_kill: all_reduce_sum in a loop for up to 60 s. Each rank writes its pid to
// DIR/rank<r>.pid once the loop is running, so the test can SIGKILL one of them mid-loop.
#include <chrono>
#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

#include "dist/mpi_communicator.h"

int main(int argc, char** argv) {
  auto comm = kestrel::dist::MpiCommunicator::create_world(&argc, &argv);
  if (!comm || argc < 2) return 2;
  const std::string dir = argv[1];
  std::vector<float> data(1024, 1.0f);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (long it = 0; std::chrono::steady_clock::now() < end; ++it) {
    const kestrel::Status st = comm.value()->all_reduce_sum(data);
    if (!st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 1;  // non-zero: mpirun ends the job
    }
    if (it == 20) {
      const std::string path = dir + "/rank" + std::to_string(comm.value()->rank()) + ".pid";
      if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
        std::fprintf(f, "%d\n", static_cast<int>(getpid()));
        std::fclose(f);
        std::rename((path + ".tmp").c_str(), path.c_str());
      }
    }
    std::fill(data.begin(), data.end(), 1.0f);
  }
  return 0;
}
