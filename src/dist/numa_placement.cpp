#include "dist/numa_placement.h"

#include <cstdlib>

#ifdef KESTREL_HAVE_NUMA
#include <numa.h>
#endif

namespace kestrel::dist {

Result<NumaMode> parse_numa_mode(const std::string& s) {
  if (s == "off") return NumaMode::kOff;
  if (s == "auto") return NumaMode::kAuto;
  if (s == "node") return NumaMode::kNode;
  return invalid_argument("--numa must be off, auto or node (got '" + s + "')");
}

int node_for_rank(int64_t local_rank, const std::vector<int>& nodes) {
  if (nodes.empty() || local_rank < 0) return -1;
  return nodes[static_cast<size_t>(local_rank % static_cast<int64_t>(nodes.size()))];
}

std::string NumaPlacement::describe() const {
  if (!bound) return "NUMA: not bound (" + std::to_string(host_nodes) + " node(s) with memory)";
  std::string list;  // CPU ranges, e.g. "0-3,8"
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!list.empty()) list += ",";
    list += std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return "NUMA node " + std::to_string(node) + " of " + std::to_string(host_nodes) + " (CPUs " + list +
         "), memory bound";
}

int64_t local_rank_from_env() {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return v != nullptr ? std::atoll(v) : 0;
}

#ifdef KESTREL_HAVE_NUMA

Result<std::vector<int>> numa_nodes_with_memory() {
  if (numa_available() < 0) return unsupported("NUMA: the kernel reports no NUMA support (numa_available)");
  std::vector<int> nodes;
  bitmask* allowed = numa_get_mems_allowed();
  for (int n = 0; n <= numa_max_node(); ++n) {
    long long free_bytes = 0;
    if (numa_bitmask_isbitset(allowed, static_cast<unsigned>(n)) && numa_node_size64(n, &free_bytes) > 0)
      nodes.push_back(n);
  }
  numa_bitmask_free(allowed);
  if (nodes.empty()) return unsupported("NUMA: no node with memory is allowed to this process");
  return nodes;
}

Result<NumaPlacement> place_on_numa(NumaMode mode, int64_t local_rank) {
  NumaPlacement p;
  if (mode == NumaMode::kOff) return p;
  auto nodes = numa_nodes_with_memory();
  if (!nodes) {
    if (mode == NumaMode::kAuto) return p;  // nothing to place on
    return nodes.error();
  }
  p.host_nodes = static_cast<int>(nodes->size());
  if (mode == NumaMode::kAuto && nodes->size() < 2) return p;
  p.node = node_for_rank(local_rank, *nodes);
  // CPUs: the node's, among those this thread may use (a cpuset or the launcher may have narrowed them).
  bitmask* node_cpus = numa_allocate_cpumask();
  bitmask* allowed = numa_allocate_cpumask();
  const bool ok = numa_node_to_cpus(p.node, node_cpus) == 0 && numa_sched_getaffinity(0, allowed) >= 0;
  if (ok)
    for (unsigned c = 0; c < node_cpus->size; ++c)
      if (numa_bitmask_isbitset(node_cpus, c) && numa_bitmask_isbitset(allowed, c)) p.cpus.push_back(static_cast<int>(c));
  bitmask* target = numa_allocate_cpumask();
  for (int c : p.cpus) numa_bitmask_setbit(target, static_cast<unsigned>(c));
  const bool set = ok && !p.cpus.empty() && numa_sched_setaffinity(0, target) == 0;
  numa_free_cpumask(target);
  numa_free_cpumask(allowed);
  numa_free_cpumask(node_cpus);
  if (!ok) return io_error("NUMA: cannot read the CPUs of node " + std::to_string(p.node) + " or this thread's affinity");
  if (p.cpus.empty())
    return unavailable("NUMA: node " + std::to_string(p.node) + " has no CPU this process may run on");
  if (!set) return io_error("NUMA: cannot set the CPU affinity to node " + std::to_string(p.node));
  bitmask* mem = numa_allocate_nodemask();
  numa_bitmask_setbit(mem, static_cast<unsigned>(p.node));
  numa_set_membind(mem);  // MPOL_BIND for every later allocation of this thread and the threads it creates
  numa_bitmask_free(mem);
  p.bound = true;
  return p;
}

#else

Result<std::vector<int>> numa_nodes_with_memory() {
  return unsupported("NUMA: this kestrel was built without libnuma (scripts/install-deps.sh installs libnuma-dev)");
}

Result<NumaPlacement> place_on_numa(NumaMode mode, int64_t) {
  if (mode == NumaMode::kNode) return numa_nodes_with_memory().error();
  return NumaPlacement{};
}

#endif

}  // namespace kestrel::dist
