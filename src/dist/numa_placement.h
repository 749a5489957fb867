// Where a rank runs and allocates: one rank per NUMA node, its threads on that node's CPUs and its memory
// (weights faulted in, cache pools, activations) on that node's memory, so every rank reads its own DRAM
// (docs/cell.md §4). libnuma (Debian libnuma-dev) does the binding; without it in the build, `--numa node`
// is refused.
//
// Call it before the rank starts any thread pool or touches its weights: OpenMP threads inherit the CPU
// affinity of the thread that creates them, and a page lands on the node of the policy in force when it is
// first touched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel::dist {

enum class NumaMode {
  kOff,   // leave the affinity and memory policy as the launcher set them
  kAuto,  // kNode when the host has more than one NUMA node with memory, else kOff
  kNode,  // bind: local rank l → node nodes[l % nodes.size()], CPUs and memory
};

Result<NumaMode> parse_numa_mode(const std::string& s);  // "off", "auto", "node"

// The node of local rank `local_rank` among the host's nodes with memory `nodes` (ascending): round robin.
int node_for_rank(int64_t local_rank, const std::vector<int>& nodes);

struct NumaPlacement {
  bool bound = false;      // false: nothing changed (kOff, or kAuto on a single node)
  int node = -1;           // the node bound to
  std::vector<int> cpus;   // the CPUs this rank may run on afterwards
  int host_nodes = 0;      // nodes with memory on this host
  std::string describe() const;  // "NUMA node 0 (CPUs 0-1), memory bound" or "NUMA: not bound (...)"
};

// The host's NUMA nodes that have memory and that this process may use; an error without libnuma or when the
// kernel has no NUMA support.
Result<std::vector<int>> numa_nodes_with_memory();

// Applies `mode` for local rank `local_rank` (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK; 0 for a single process):
// the calling thread's CPU affinity becomes the node's CPUs (those it is allowed), its memory policy
// MPOL_BIND to the node. Errors name what failed and change nothing that was not already changed.
Result<NumaPlacement> place_on_numa(NumaMode mode, int64_t local_rank);

// This process's local rank on its host under mpirun (OMPI_COMM_WORLD_LOCAL_RANK), else 0.
int64_t local_rank_from_env();

}  // namespace kestrel::dist
