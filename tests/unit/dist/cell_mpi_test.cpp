// The cell on Open MPI: one process per rank under mpiexec (ctest cell_mpi_np2 / cell_mpi_np4; EP = the
// number of ranks). Every rank generates its own copy of each tiny checkpoint, then runs the checks of
// cell_checks.h: logits bit-identical to one process, exact per-rank weight bytes, traffic accounting; and the
// same with TP groups of 2 ranks (logits within the stated tolerance, bytes as `plan --cell --tp 2`).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "cell_checks.h"
#include "common/test_util.h"
#include "dist/mpi_communicator.h"

namespace kestrel::testing {
namespace {

dist::MpiCommunicator* g_comm = nullptr;

class CellMpi : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { make_checkpoint(GetParam(), tmp_.path()); }
  TempDir tmp_;
};

TEST_P(CellMpi, LogitsEqualOneProcessBitForBit) { check_cell_matches_single_process(*g_comm, tmp_.path()); }
TEST_P(CellMpi, EachRankBindsItsOwnExperts) { check_cell_weight_bytes(*g_comm, tmp_.path()); }
TEST_P(CellMpi, TrafficEqualsBytesHandedToTheCommunicator) {
  check_cell_traffic_matches_routing(*g_comm, tmp_.path());
}
// Tensor parallel, groups of 2 ranks (docs/cell.md §7).
TEST_P(CellMpi, Tp2LogitsWithinToleranceGreedyIdenticalRunToRunBitwise) {
  check_cell_matches_single_process(*g_comm, tmp_.path(), 2);
}
TEST_P(CellMpi, Tp2EachRankBindsItsSlicesAsPlanned) { check_cell_weight_bytes(*g_comm, tmp_.path(), 2); }
TEST_P(CellMpi, Tp2TrafficEqualsBytesHandedToTheCommunicator) {
  check_cell_traffic_matches_routing(*g_comm, tmp_.path(), 2);
}

INSTANTIATE_TEST_SUITE_P(Models, CellMpi,
                         ::testing::Values("k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny", "deepseek-v3-tiny",
                                           "deepseek-v32-sparse-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.message());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace kestrel::testing

int main(int argc, char** argv) {
  auto comm = kestrel::dist::MpiCommunicator::create_world(&argc, &argv);
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.error().message().c_str());
    return 2;
  }
  kestrel::testing::g_comm = comm->get();
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = (*comm)->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new kestrel::testing::RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  std::vector<int> all(static_cast<size_t>((*comm)->size()));
  std::vector<size_t> ones(all.size(), 1);
  if (!(*comm)->all_gather_v<int>(std::span<const int>(&failed, 1), all, ones).is_ok()) return 3;
  int any = 0;
  for (int f : all) any |= f;
  if (rank == 0 && any) std::fprintf(stderr, "cell_mpi_test: a rank failed (see [rank N] lines above)\n");
  comm->reset();
  return any;
}
