// The collectives on the in-process fake (2, 3 and 4 ranks as threads), the hub's bounded waits, and the
// piece arithmetic of the MPI backend's large-count path.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "collective_checks.h"
#include "dist/fake_communicator.h"
#include "dist/large_count.h"

namespace kestrel::dist {
namespace {

// Short enough that a test whose ranks went out of step fails instead of hanging the suite.
FakeHub::Options test_options() { return {.timeout = std::chrono::milliseconds(30000)}; }

class FakeCollectives : public ::testing::TestWithParam<int> {};

TEST_P(FakeCollectives, AllReduceMatchesSerialRankOrderSum) {
  run_fake_ranks(GetParam(), testing::check_all_reduce_matches_serial, test_options());
}
TEST_P(FakeCollectives, AllReduceBitReproducible) {
  run_fake_ranks(GetParam(), testing::check_all_reduce_reproducible, test_options());
}
TEST_P(FakeCollectives, ReduceScatter) { run_fake_ranks(GetParam(), testing::check_reduce_scatter, test_options()); }
TEST_P(FakeCollectives, AllGatherV) { run_fake_ranks(GetParam(), testing::check_all_gather_v, test_options()); }
TEST_P(FakeCollectives, AllToAllV) { run_fake_ranks(GetParam(), testing::check_all_to_all_v, test_options()); }
TEST_P(FakeCollectives, BroadcastFromEveryRoot) {
  run_fake_ranks(GetParam(), testing::check_broadcast, test_options());
}
TEST_P(FakeCollectives, BarrierAndBadArguments) {
  run_fake_ranks(GetParam(), testing::check_barrier_and_bad_arguments, test_options());
}

INSTANTIATE_TEST_SUITE_P(Ranks, FakeCollectives, ::testing::Values(2, 3, 4));

TEST(FakeCommunicator, SingleRankIsIdentity) {
  run_fake_ranks(1, [](Communicator& comm) {
    std::vector<float> v{1.5f, -0.0f};
    ASSERT_TRUE(comm.all_reduce_sum(v).is_ok());
    EXPECT_EQ(v[0], 1.5f);
    EXPECT_TRUE(std::signbit(v[1]));
  });
}

TEST(FakeCommunicator, MissingRankTimesOutInsteadOfHanging) {
  std::vector<Status> got(3);
  const auto start = std::chrono::steady_clock::now();
  run_fake_ranks(
      3,
      [&](Communicator& comm) {
        if (comm.rank() == 2) return;  // never arrives
        got[comm.rank()] = comm.barrier();
      },
      {.timeout = std::chrono::milliseconds(200)});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kUnavailable);
    EXPECT_NE(got[r].message().find("rank(s) 2 never arrived"), std::string::npos) << got[r].message();
  }
}

TEST(FakeCommunicator, MismatchedCollectivesAreReported) {
  std::vector<Status> got(2);
  run_fake_ranks(2, [&](Communicator& comm) {
    std::vector<float> v(3, 1.0f);
    got[comm.rank()] = comm.rank() == 0 ? comm.barrier() : comm.broadcast<float>(v, 0);
  });
  for (const Status& st : got) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("while rank"), std::string::npos) << st.message();
  }
}

TEST(FakeCommunicator, MismatchedCountsAreReported) {
  std::vector<Status> got(2);
  run_fake_ranks(2, [&](Communicator& comm) {
    std::vector<uint8_t> send(comm.rank() == 0 ? 3 : 2), recv(8);
    std::vector<size_t> counts{3, 3}, displs{0, 4};  // rank 1 sends 2 bytes, everyone expects 3
    got[comm.rank()] = comm.all_gather_v<uint8_t>(send, recv, counts, displs);
  });
  for (const Status& st : got) EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
}

TEST(LargeCount, PiecesCoverTheBlockExactly) {
  EXPECT_EQ(piece_count(0, 7), 0u);
  EXPECT_EQ(piece_count(7, 7), 1u);
  EXPECT_EQ(piece_count(8, 7), 2u);
  for (size_t bytes : {size_t{1}, size_t{6}, size_t{7}, size_t{50}, size_t{49}}) {
    size_t next = 0;
    for (size_t i = 0; i < piece_count(bytes, 7); ++i) {
      const Piece p = piece(bytes, 7, i);
      EXPECT_EQ(p.offset, next);
      EXPECT_GT(p.bytes, 0u);
      EXPECT_LE(p.bytes, 7u);
      next += p.bytes;
    }
    EXPECT_EQ(next, bytes);
  }
  // A block of 5 GiB with the real limit: three pieces, none over INT_MAX.
  const size_t big = size_t{5} << 30, limit = 2147483647;
  ASSERT_EQ(piece_count(big, limit), 3u);
  EXPECT_EQ(piece(big, limit, 2).bytes, big - 2 * limit);
  const std::vector<size_t> ok{0, 7}, over{0, 8};
  EXPECT_TRUE(all_fit(ok, 7));
  EXPECT_FALSE(all_fit(over, 7));
}

}  // namespace
}  // namespace kestrel::dist
