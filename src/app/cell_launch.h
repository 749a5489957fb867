// `--ep E` on generate / bench: joins the cell that mpirun started (E ranks, one process each; docs/cell.md).
// E = 1 outside mpirun is the ordinary single process (no cell). Every rank loads the model with its
// ExpertShard; rank 0 runs the command, the others follow rank 0's steps and exit quietly.
#pragma once

#include <memory>

#include "base/result.h"
#include "dist/communicator.h"
#include "layers/expert_shard.h"

namespace kestrel::app {

struct CellLaunch {
  std::unique_ptr<dist::Communicator> comm;
  ExpertShard shard;  // the model keeps a pointer: this object must outlive it
};

// null for --ep 1 in a single process; an error when the flag and the MPI job disagree or when this build has
// no Open MPI.
Result<std::unique_ptr<CellLaunch>> open_cell(int64_t ep);

// A cell rank cannot hand an error back to its peers (they wait in the next collective): it prints
// "kestrel: rank R of P: <message>", exits 1, and mpirun ends the other ranks.
[[noreturn]] void cell_exit(const CellLaunch& c, const Status& s);

}  // namespace kestrel::app
