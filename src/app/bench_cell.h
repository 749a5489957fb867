// `kestrel bench --ep E` inside a cell (docs/cell.md): batched prefill and lockstep decode of --batch sequences
// spread round-robin over the ranks; per-rank weight and cache bytes; per-decode-step bytes sent between ranks,
// measured at the communicator and computed from the cell's plans and routing (equal), next to the
// uniform-routing expectation of `kestrel plan --cell`.
#pragma once

#include <string>

#include "app/args.h"
#include "app/cell_launch.h"

namespace kestrel::app {

// Every rank calls it; rank 0 prints the report.
int bench_cell(const Args& a, const std::string& dir, CellLaunch& launch);

}  // namespace kestrel::app
