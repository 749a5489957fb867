// The collectives on Open MPI: one process per rank under mpiexec (ctest dist_mpi_np2 / dist_mpi_np4). Each
// check runs twice: with the default piece size (one MPI call per collective) and with pieces of at most 7
// bytes, which sends every block over 7 bytes through the large-count paths (dist/large_count.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "collective_checks.h"
#include "dist/mpi_communicator.h"

namespace kestrel::dist {
namespace {

MpiCommunicator* g_default = nullptr;
MpiCommunicator* g_pieces = nullptr;

class MpiCollectives : public ::testing::TestWithParam<const char*> {
 protected:
  Communicator& comm() { return std::string(GetParam()) == "default" ? *g_default : *g_pieces; }
};

TEST_P(MpiCollectives, AllReduceMatchesSerialRankOrderSum) { testing::check_all_reduce_matches_serial(comm()); }
TEST_P(MpiCollectives, ReduceScatter) { testing::check_reduce_scatter(comm()); }
TEST_P(MpiCollectives, AllGatherV) { testing::check_all_gather_v(comm()); }
TEST_P(MpiCollectives, AllToAllV) { testing::check_all_to_all_v(comm()); }
TEST_P(MpiCollectives, BroadcastFromEveryRoot) { testing::check_broadcast(comm()); }
TEST_P(MpiCollectives, BarrierAndBadArguments) { testing::check_barrier_and_bad_arguments(comm()); }

INSTANTIATE_TEST_SUITE_P(Pieces, MpiCollectives, ::testing::Values("default", "max7"));

// 20 repetitions on the default communicator only: with 7-byte pieces each would take seconds on 2 cores.
TEST(MpiCommunicator, AllReduceBitReproducible) { testing::check_all_reduce_reproducible(*g_default); }

// Displacements past the piece limit while the whole gather fits one call: received packed, then moved.
TEST(MpiCommunicator, AllGatherDisplacementsBeyondLimit) {
  const int n = g_pieces->size(), me = g_pieces->rank();
  std::vector<size_t> counts(n, 1), displs(n);
  for (int r = 0; r < n; ++r) displs[r] = 100 + 10 * static_cast<size_t>(n - 1 - r);  // > 7, reversed
  if (static_cast<size_t>(n) > 7) GTEST_SKIP() << "needs at most 7 ranks for a total within the limit";
  std::vector<uint8_t> send{static_cast<uint8_t>(40 + me)}, recv(200, 0);
  ASSERT_TRUE(g_pieces->all_gather_v<uint8_t>(send, recv, counts, displs).is_ok());
  for (int r = 0; r < n; ++r) EXPECT_EQ(recv[displs[r]], 40 + r);
  EXPECT_EQ(recv[0], 0);
}

// An error inside MPI (MPI_ERRORS_RETURN) comes back as a Status naming the call and the rank. A root that
// is not a rank is refused by MPI's argument check on every rank alike, so no rank is left waiting.
TEST(MpiCommunicator, MpiErrorBecomesStatusNamingCallAndRank) {
  std::vector<float> v(3);
  const Status st = g_default->broadcast<float>(v, g_default->size() + 3);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("MPI_Bcast failed on rank " + std::to_string(g_default->rank())), std::string::npos)
      << st.message();
  EXPECT_TRUE(g_default->barrier().is_ok());
}

// Prints failures of ranks other than 0 with their rank (their default printer is removed to keep the log
// readable).
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
}  // namespace kestrel::dist

int main(int argc, char** argv) {
  using kestrel::dist::MpiCommunicator;
  auto plain = MpiCommunicator::create_world(&argc, &argv);
  if (!plain) {
    std::fprintf(stderr, "%s\n", plain.error().message().c_str());
    return 2;
  }
  auto pieces = MpiCommunicator::create_world(&argc, &argv, {.max_count = 7});
  if (!pieces) {
    std::fprintf(stderr, "%s\n", pieces.error().message().c_str());
    return 2;
  }
  kestrel::dist::g_default = plain->get();
  kestrel::dist::g_pieces = pieces->get();
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = plain.value()->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new kestrel::dist::RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // Every rank learns whether any rank failed, so the exit status does not depend on which rank mpiexec reports.
  std::vector<int> all(plain.value()->size());
  std::vector<size_t> ones(all.size(), 1);
  if (!plain.value()->all_gather_v<int>(std::span<const int>(&failed, 1), all, ones).is_ok()) return 3;
  int any = 0;
  for (int f : all) any |= f;
  if (rank == 0 && any) std::fprintf(stderr, "dist_mpi_test: a rank failed (see [rank N] lines above)\n");
  pieces.value().reset();
  plain.value().reset();
  return any;
}
