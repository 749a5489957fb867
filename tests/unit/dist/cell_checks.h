// Whole-model cell checks shared by the in-process fake (cell_fake_test) and Open MPI (cell_mpi_np2 / np4):
// every rank of `comm` calls them together. Failures are reported with gtest macros on the rank that sees them.
#pragma once

#include <string>

#include "dist/communicator.h"

namespace kestrel::testing {

// The relative fp32 tolerance of a tensor-parallel cell's logits against one process (docs/cell.md §7):
// |cell − one process| ≤ kTpLogitTolerance · max(1, max |logit| of the row), every row.
inline constexpr double kTpLogitTolerance = 1e-5;

// A generated tiny checkpoint run by the cell of `comm` (EP = comm.size(), TP groups of `tp` ranks): a
// scripted workload (several sequences spread over the ranks, batched prefill, decode, a step with idle ranks,
// a sequence restarted while others decode) gives the greedy tokens of each sequence run alone by one process,
// and logits bit-identical to it at tp 1, within kTpLogitTolerance at tp > 1. At tp > 1 the workload then runs
// again with every sequence alone in its step, and gives the first run's logits bit for bit (run to run and
// whatever the batch). `dir` is this rank's copy of the checkpoint.
void check_cell_matches_single_process(dist::Communicator& comm, const std::string& dir, int tp = 1);

// Each rank binds exactly the replicated tensors plus its own routed experts' tensors (byte counts from the
// checkpoint's headers), and the ranks together bind every routed expert once. At tp > 1: each rank binds
// its slices of the dense MLPs and shared experts instead of the whole tensors, the members of a TP group
// together bind each of those bytes once, and every rank's bytes equal `kestrel plan --cell --tp`'s.
void check_cell_weight_bytes(dist::Communicator& comm, const std::string& dir, int tp = 1);

// The MoE (and TP) traffic a step records equals the bytes handed to the communicator.
void check_cell_traffic_matches_routing(dist::Communicator& comm, const std::string& dir, int tp = 1);

}  // namespace kestrel::testing
