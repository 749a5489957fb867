// Whole-model cell checks shared by the in-process fake (cell_fake_test) and Open MPI (cell_mpi_np2 / np4):
// every rank of `comm` calls them together. Failures are reported with gtest macros on the rank that sees them.
#pragma once

#include <string>

#include "dist/communicator.h"

namespace kestrel::testing {

// A generated tiny checkpoint run by the cell of `comm` (EP = comm.size()): a scripted workload (several
// sequences spread over the ranks, batched prefill, decode, a step with idle ranks, a sequence restarted
// while others decode) gives logits bit-identical to each sequence run alone by one process, and the same
// greedy tokens. `dir` is this rank's copy of the checkpoint.
void check_cell_matches_single_process(dist::Communicator& comm, const std::string& dir);

// Each rank binds exactly the replicated tensors plus its own routed experts' tensors (byte counts from the
// checkpoint's headers), and the ranks together bind every routed expert once.
void check_cell_weight_bytes(dist::Communicator& comm, const std::string& dir);

// The MoE traffic a step records equals the bytes computed from the routing (ep_traffic_from_routing).
void check_cell_traffic_matches_routing(dist::Communicator& comm, const std::string& dir);

}  // namespace kestrel::testing
