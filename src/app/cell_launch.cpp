#include "app/cell_launch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "dist/numa_placement.h"

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

Result<std::unique_ptr<CellLaunch>> open_cell(int64_t ep, int64_t tp) {
  const int64_t world = launched_ranks();
  if (ep < 1) return invalid_argument("--ep must be at least 1");
  if (tp < 1 || ep % tp != 0)
    return invalid_argument("--tp " + std::to_string(tp) + " must divide the cell's " + std::to_string(ep) +
                            " ranks (--ep): TP groups are --tp consecutive ranks");
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
  c->shard.tp = static_cast<int>(tp);
  c->comm = std::move(*comm);
  c->shard.comm = c->comm.get();
  return c;
#else
  return unsupported("--ep " + std::to_string(ep) + ": this kestrel was built without Open MPI "
                     "(scripts/install-deps.sh installs libopenmpi-dev)");
#endif
}

Status apply_numa(const Args& a, const CellLaunch* cl, bool quiet) {
  auto mode = dist::parse_numa_mode(a.str("numa"));
  if (!mode) return mode.error();
  if (*mode == dist::NumaMode::kAuto && (cl == nullptr || cl->shard.size < 2)) return Status::ok();
  auto p = dist::place_on_numa(*mode, cl != nullptr ? dist::local_rank_from_env() : 0);
  if (!p) return p.error();
  if (!quiet && (p->bound || *mode == dist::NumaMode::kNode)) {
    if (cl != nullptr)
      std::fprintf(stderr, "kestrel: rank %d of %d: %s\n", cl->shard.rank, cl->shard.size, p->describe().c_str());
    else
      std::fprintf(stderr, "kestrel: %s\n", p->describe().c_str());
    std::fflush(stderr);
  }
  return Status::ok();
}

Result<dist::LivenessOptions> liveness_flags(const Args& a) {
  auto window = a.integer("cell-liveness-ms"), deadline = a.integer("cell-deadline-ms");
  if (!window) return window.error();
  if (!deadline) return deadline.error();
  for (auto [flag, v] : {std::pair{"--cell-liveness-ms", *window}, std::pair{"--cell-deadline-ms", *deadline}})
    if (v < 10 || v > 3'600'000) return invalid_argument(std::string(flag) + " must be in 10..3600000");
  if (*deadline < *window) return invalid_argument("--cell-deadline-ms must be at least --cell-liveness-ms");
  dist::LivenessOptions o;
  o.window = std::chrono::milliseconds(*window);
  o.deadline = std::chrono::milliseconds(*deadline);
  return o;
}

std::unique_ptr<dist::Liveness> open_liveness(CellLaunch& c, const dist::LivenessOptions& o, bool report_health) {
  auto l = dist::Liveness::open(*c.comm, o);
  if (!l) cell_exit(c, l.error());
  dist::Liveness::Events ev;
  ev.deadline = [&c, o](const std::string& why) {
    cell_exit(c, unavailable("cell liveness: " + why + "; ending the cell (--cell-deadline-ms " +
                             std::to_string(o.deadline.count()) + ")"));
  };
  if (report_health && c.shard.rank == 0) {
    ev.unhealthy = [](const std::string& why) {
      std::fprintf(stderr, "kestrel serve: cell unhealthy, /health answers 503: %s\n", why.c_str());
      std::fflush(stderr);
    };
    ev.healthy = [](const std::string&) {
      std::fprintf(stderr, "kestrel serve: cell healthy again: every rank is beating\n");
      std::fflush(stderr);
    };
  }
  (*l)->start(std::move(ev));
  return std::move(*l);
}

void cell_exit(const CellLaunch& c, const Status& s) {
  std::fprintf(stderr, "kestrel: rank %d of %d: %s\n", c.shard.rank, c.shard.size, s.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace kestrel::app
