#include "app/cell_launch.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#ifdef KESTREL_HAVE_MPI
#include "dist/mpi_communicator.h"
#endif

namespace kestrel::app {

namespace {
// Ranks in the job mpirun (Open MPI) started this process in; 1 outside mpirun.
int64_t launched_ranks() {
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  return n != nullptr ? std::atoll(n) : 1;
}
}  // namespace

Result<std::unique_ptr<CellLaunch>> open_cell(int64_t ep) {
  const int64_t world = launched_ranks();
  if (ep < 1) return invalid_argument("--ep must be at least 1");
  if (ep == 1 && world == 1) return std::unique_ptr<CellLaunch>();
  if (ep != world)
    return invalid_argument("--ep " + std::to_string(ep) + " needs exactly " + std::to_string(ep) +
                            " ranks (mpirun -np " + std::to_string(ep) + "); this job has " + std::to_string(world));
#ifdef KESTREL_HAVE_MPI
  auto comm = dist::MpiCommunicator::create_world(nullptr, nullptr);
  if (!comm) return comm.error();
  auto c = std::make_unique<CellLaunch>();
  c->shard.rank = (*comm)->rank();
  c->shard.size = (*comm)->size();
  c->comm = std::move(*comm);
  c->shard.comm = c->comm.get();
  return c;
#else
  return unsupported("--ep " + std::to_string(ep) + ": this kestrel was built without Open MPI "
                     "(scripts/install-deps.sh installs libopenmpi-dev)");
#endif
}

void cell_exit(const CellLaunch& c, const Status& s) {
  std::fprintf(stderr, "kestrel: rank %d of %d: %s\n", c.shard.rank, c.shard.size, s.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace kestrel::app
