// NUMA placement of a rank (dist/numa_placement.h): the mode flag, the round robin of local ranks over nodes,
// and the binding itself, checked from the kernel's side (sched_getaffinity, get_mempolicy) in a forked child so
// that this test process keeps its own affinity and policy. On a one-node host the binding is to node 0 with
// all its CPUs: the checks still see MPOL_BIND and the node mask, which `--numa off` or a lost call would not give.
#include "dist/numa_placement.h"

#include <gtest/gtest.h>
#include <numaif.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <thread>

namespace kestrel::dist {
namespace {

TEST(NumaPlacement, ParsesModes) {
  EXPECT_EQ(*parse_numa_mode("off"), NumaMode::kOff);
  EXPECT_EQ(*parse_numa_mode("auto"), NumaMode::kAuto);
  EXPECT_EQ(*parse_numa_mode("node"), NumaMode::kNode);
  auto bad = parse_numa_mode("socket");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("--numa must be off, auto or node"), std::string::npos);
}

TEST(NumaPlacement, LocalRanksGoRoundRobinOverNodes) {
  const std::vector<int> nodes = {0, 2, 3};
  const int want[] = {0, 2, 3, 0, 2, 3, 0};
  for (int r = 0; r < 7; ++r) EXPECT_EQ(node_for_rank(r, nodes), want[r]) << r;
  EXPECT_EQ(node_for_rank(0, {}), -1);
  EXPECT_EQ(node_for_rank(-1, nodes), -1);
}

TEST(NumaPlacement, DescribesCpuRanges) {
  NumaPlacement p;
  p.bound = true, p.node = 1, p.host_nodes = 2, p.cpus = {0, 1, 2, 3, 8, 10, 11};
  EXPECT_EQ(p.describe(), "NUMA node 1 of 2 (CPUs 0-3,8,10-11), memory bound");
  EXPECT_EQ(NumaPlacement{}.describe(), "NUMA: not bound (0 node(s) with memory)");
}

// The calling thread's CPU set and memory policy, as the kernel reports them.
struct Seen {
  std::set<int> cpus;
  int policy = -1;
  std::set<int> mem_nodes;
};

Seen seen_now() {
  Seen s;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) s.cpus.insert(c);
  unsigned long mask[16] = {};
  if (get_mempolicy(&s.policy, mask, sizeof mask * 8, nullptr, 0) == 0)
    for (int n = 0; n < static_cast<int>(sizeof mask * 8); ++n)
      if (mask[n / 64] >> (n % 64) & 1) s.mem_nodes.insert(n);
  return s;
}

// Runs `body` in a forked child; its return value is the child's exit status (0 = every check held).
int in_child(int (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(NumaPlacement, HostNodesAreListed) {
  auto nodes = numa_nodes_with_memory();
  ASSERT_TRUE(nodes) << nodes.error().message();
  ASSERT_FALSE(nodes->empty());
  for (size_t i = 1; i < nodes->size(); ++i) EXPECT_LT((*nodes)[i - 1], (*nodes)[i]);
}

int bind_rank(int64_t local_rank) {
  auto nodes = numa_nodes_with_memory();
  auto p = place_on_numa(NumaMode::kNode, local_rank);
  if (!nodes || !p || !p->bound) return 1;
  if (p->node != node_for_rank(local_rank, *nodes) || p->host_nodes != static_cast<int>(nodes->size())) return 2;
  const Seen main = seen_now();
  if (main.cpus != std::set<int>(p->cpus.begin(), p->cpus.end())) return 3;
  if (main.policy != MPOL_BIND || main.mem_nodes != std::set<int>{p->node}) return 4;
  Seen thread;  // a thread started afterwards (an OpenMP worker, the scheduler) inherits both
  std::thread([&] { thread = seen_now(); }).join();
  if (thread.cpus != main.cpus || thread.policy != MPOL_BIND || thread.mem_nodes != main.mem_nodes) return 5;
  return 0;
}

TEST(NumaPlacement, NodeModeBindsCpusAndMemoryOfTheRanksNode) {
  EXPECT_EQ(in_child([] { return bind_rank(0); }), 0);
  EXPECT_EQ(in_child([] { return bind_rank(1); }), 0);  // rank 1: the second node, or node 0 again on one node
}

TEST(NumaPlacement, OffChangesNothing) {
  EXPECT_EQ(in_child([] {
              const Seen before = seen_now();
              auto p = place_on_numa(NumaMode::kOff, 0);
              const Seen after = seen_now();
              return p && !p->bound && before.cpus == after.cpus && after.policy == before.policy ? 0 : 1;
            }),
            0);
}

TEST(NumaPlacement, AutoBindsOnlyOnHostsWithSeveralNodes) {
  EXPECT_EQ(in_child([] {
              auto nodes = numa_nodes_with_memory();
              const Seen before = seen_now();
              auto p = place_on_numa(NumaMode::kAuto, 0);
              if (!nodes || !p) return 1;
              if (nodes->size() > 1) return p->bound && seen_now().policy == MPOL_BIND ? 0 : 2;
              return !p->bound && seen_now().policy == before.policy ? 0 : 3;
            }),
            0);
}

}  // namespace
}  // namespace kestrel::dist
