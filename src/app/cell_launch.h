// `--ep E` on generate / bench / serve: joins the cell that mpirun started (E ranks, one process each;
// docs/cell.md). E = 1 outside mpirun is the ordinary single process (no cell). Every rank loads the model with
// its ExpertShard; rank 0 runs the command, the others follow rank 0's steps and exit quietly. Every rank also
// beats on the cell's liveness connections (dist/liveness.h), so a rank that is gone or frozen never hangs the
// cell: it ends at --cell-deadline-ms.
#pragma once

#include <memory>

#include "app/args.h"
#include "base/result.h"
#include "dist/communicator.h"
#include "dist/liveness.h"
#include "layers/expert_shard.h"

namespace kestrel::app {

struct CellLaunch {
  std::unique_ptr<dist::Communicator> comm;
  ExpertShard shard;  // the model keeps a pointer: this object must outlive it
};

// null for --ep 1 in a single process; an error when the flag and the MPI job disagree, when --tp does not
// divide the ranks, or when this build has no Open MPI. tp > 1: the dense FFN work is tensor parallel over
// groups of tp consecutive ranks (docs/cell.md §7).
Result<std::unique_ptr<CellLaunch>> open_cell(int64_t ep, int64_t tp);

// --numa, right after open_cell and before any thread pool starts or weights are touched: binds this process
// (in a cell: the rank with its local rank on the host) to a NUMA node, CPUs and memory (dist/numa_placement.h).
// `auto` binds only ranks of a cell on a host with several nodes. Logs where it bound unless `quiet`.
Status apply_numa(const Args& a, const CellLaunch* cl, bool quiet);

// --cell-liveness-ms and --cell-deadline-ms (the deadline at least the window).
Result<dist::LivenessOptions> liveness_flags(const Args& a);

// Every rank, right after open_cell (collective): opens the liveness connections and starts the heartbeats. A
// peer silent or gone past the deadline ends this rank through cell_exit, and mpirun the rest. With
// `report_health`, rank 0 also logs when the cell turns unhealthy and healthy again ("<who>: cell unhealthy,
// /health answers 503: ..."); without, a peer that goes away matters only at the deadline (a planned stop
// ends every rank well before it).
std::unique_ptr<dist::Liveness> open_liveness(CellLaunch& c, const dist::LivenessOptions& o, bool report_health);

// A cell rank cannot hand an error back to its peers (they wait in the next collective): it prints
// "kestrel: rank R of P: <message>", exits 1, and mpirun ends the other ranks.
[[noreturn]] void cell_exit(const CellLaunch& c, const Status& s);

}  // namespace kestrel::app
