// The cell on the in-process fake communicator (one thread per rank): tiny K3, K3 with DSA layers, Kimi Linear,
// DeepSeek V3 and V3.2 (DSA top-8) at EP 1, 2 and 4 — logits bit-identical to one process, exact per-rank
// weight bytes, MoE traffic equal to the bytes handed to the communicator. The same checks run under mpiexec
// in cell_mpi_np2 / cell_mpi_np4. CellFakeTp: the same models at EP 2 and 4 with TP groups of 2 (logits within
// the stated tolerance, greedy identical, run-to-run bitwise, bytes as planned). CellFakeApi: bad steps refused
// on rank 0 before the broadcast.
#include <gtest/gtest.h>

#include "cell_checks.h"
#include "common/test_util.h"
#include "dist/fake_communicator.h"
#include "runtime/cell.h"

namespace kestrel::testing {
namespace {

struct Case {
  const char* name;
  const char* preset;
};

class CellFake : public ::testing::TestWithParam<std::tuple<Case, int>> {
 protected:
  void SetUp() override { make_checkpoint(std::get<0>(GetParam()).preset, tmp_.path()); }
  int ranks() const { return std::get<1>(GetParam()); }
  TempDir tmp_;
};

TEST_P(CellFake, LogitsEqualOneProcessBitForBit) {
  dist::run_fake_ranks(ranks(), [&](dist::Communicator& c) { check_cell_matches_single_process(c, tmp_.path()); });
}

TEST_P(CellFake, EachRankBindsItsOwnExperts) {
  dist::run_fake_ranks(ranks(), [&](dist::Communicator& c) { check_cell_weight_bytes(c, tmp_.path()); });
}

TEST_P(CellFake, TrafficEqualsBytesHandedToTheCommunicator) {
  dist::run_fake_ranks(ranks(), [&](dist::Communicator& c) { check_cell_traffic_matches_routing(c, tmp_.path()); });
}

// Tensor parallel (docs/cell.md §7): EP = the ranks, TP groups of 2 inside them (EP 2 TP 2, EP 4 TP 2).
class CellFakeTp : public ::testing::TestWithParam<std::tuple<Case, int>> {
 protected:
  void SetUp() override { make_checkpoint(std::get<0>(GetParam()).preset, tmp_.path()); }
  int ranks() const { return std::get<1>(GetParam()); }
  TempDir tmp_;
};

TEST_P(CellFakeTp, LogitsWithinToleranceGreedyIdenticalRunToRunBitwise) {
  dist::run_fake_ranks(ranks(), [&](dist::Communicator& c) { check_cell_matches_single_process(c, tmp_.path(), 2); });
}

TEST_P(CellFakeTp, EachRankBindsItsSlicesAsPlanned) {
  dist::run_fake_ranks(ranks(), [&](dist::Communicator& c) { check_cell_weight_bytes(c, tmp_.path(), 2); });
}

TEST_P(CellFakeTp, TrafficEqualsBytesHandedToTheCommunicator) {
  dist::run_fake_ranks(ranks(), [&](dist::Communicator& c) { check_cell_traffic_matches_routing(c, tmp_.path(), 2); });
}

INSTANTIATE_TEST_SUITE_P(
    Models, CellFakeTp,
    ::testing::Combine(::testing::Values(Case{"k3", "k3-tiny"}, Case{"k3_dsa", "k3-tiny-dsa"},
                                         Case{"kimi_linear", "kimi-linear-tiny"},
                                         Case{"deepseek_v3", "deepseek-v3-tiny"},
                                         Case{"deepseek_v32_dsa", "deepseek-v32-sparse-tiny"}),
                       ::testing::Values(2, 4)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + "_ep" + std::to_string(std::get<1>(info.param)) + "_tp2";
    });

INSTANTIATE_TEST_SUITE_P(
    Models, CellFake,
    ::testing::Combine(::testing::Values(Case{"k3", "k3-tiny"}, Case{"k3_dsa", "k3-tiny-dsa"},
                                         Case{"kimi_linear", "kimi-linear-tiny"},
                                         Case{"deepseek_v3", "deepseek-v3-tiny"},
                                         Case{"deepseek_v32_dsa", "deepseek-v32-sparse-tiny"},
                                         Case{"qwen3moe", "qwen3moe-micro-bf16"}),
                       ::testing::Values(1, 2, 4)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + "_ep" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace kestrel::testing

namespace kestrel::testing {
namespace {

// Bad steps are refused on rank 0 before anything is broadcast, and the cell goes on: the followers never see
// them. Only rank 0 plans; only the others follow.
TEST(CellFakeApi, BadStepsAreRefusedBeforeTheBroadcast) {
  TempDir tmp;
  make_checkpoint("k3-tiny", tmp.path());
  dist::run_fake_ranks(2, [&](dist::Communicator& c) {
    ExpertShard shard{&c, c.rank(), c.size(), {}};
    auto model = load_model(tmp.path(), &shard);
    ASSERT_TRUE(model) << model.error().message();
    Cell cell(**model, c);
    if (c.rank() != 0) {
      std::vector<float> unused;
      EXPECT_FALSE(cell.step({}, unused).is_ok());
      EXPECT_TRUE(cell.follow().is_ok());
      EXPECT_EQ(cell.held_sequences(), 1u);
      return;
    }
    EXPECT_FALSE(cell.follow().is_ok());
    std::vector<float> logits;
    const int32_t V = (*model)->config().text.vocab_size;
    EXPECT_FALSE(cell.step({CellRun{0, 2, true, false, {1}}}, logits).is_ok());  // no rank 2
    EXPECT_FALSE(cell.step({CellRun{0, 1, true, false, {}}}, logits).is_ok());   // no tokens
    EXPECT_FALSE(cell.step({CellRun{0, 1, true, false, {V}}}, logits).is_ok());  // outside the vocabulary
    ASSERT_TRUE(cell.step({CellRun{0, 1, true, false, {1, 2, 3}}}, logits).is_ok());
    EXPECT_EQ(logits.size(), static_cast<size_t>(V));
    EXPECT_EQ(cell.held_sequences(), 0u);  // the sequence lives on rank 1
    EXPECT_TRUE(cell.finish().is_ok());
  });
}

}  // namespace
}  // namespace kestrel::testing
