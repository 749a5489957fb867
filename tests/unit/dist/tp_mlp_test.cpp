// The tensor-parallel MLP (GatedMlp::bind_dense / forward over a TP group, docs/cell.md §7) on the in-process
// fake, on a dense layer of tiny K3 (BF16) and DeepSeek V3 (FP8 blocks, intermediate 384 = 3 blocks, so a group
// of 4 has a member without columns): every rank's output rows equal, bit for bit, the serial sum in group
// order of the members' partial products (each member's slice run alone over the gathered rows), and lie within
// the stated fp32 tolerance of the whole MLP; ranks have different token counts, one none. Groups of 2, 3 and 4
// ranks in one cell, and two groups of 2 in a cell of 4. A format that cannot be sliced, and an FP8 slice off the
// 128-wide blocks, are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <regex>

#include "cell_checks.h"
#include "common/test_util.h"
#include "dist/fake_communicator.h"
#include "dist/tp_partition.h"
#include "layers/ffn.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"

namespace kestrel::testing {
namespace {

// Tokens on rank r, and its input rows (hidden width D), deterministic.
int64_t tokens_of(int r) { return (r * 3 + 1) % 5; }  // 1, 4, 2, 0
std::vector<float> rows_of(int r, int64_t D) {
  std::vector<float> x(static_cast<size_t>(tokens_of(r) * D));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(r));
  return x;
}

// The prefix of the first dense layer's MLP.
std::string dense_prefix(const Checkpoint& ck) {
  const std::regex re(R"(^(.*layers\.[0-9]+\.mlp\.)gate_proj\.weight$)");
  for (const std::string& n : ck.names()) {
    std::smatch m;
    if (std::regex_match(n, m, re)) return m[1];
  }
  return "";
}

class TpMlp : public ::testing::TestWithParam<std::tuple<const char*, int, int>> {
 protected:
  void SetUp() override {
    make_checkpoint(std::get<0>(GetParam()), tmp_.path());
    auto cfg = load_model_config(tmp_.path());
    ASSERT_TRUE(cfg) << cfg.error().message();
    cfg_ = std::move(*cfg);
  }
  TempDir tmp_;
  ModelConfig cfg_;
};

TEST_P(TpMlp, RankOrderSumOfSlicesBitForBitAndWithinToleranceOfTheWholeMlp) {
  const int P = std::get<1>(GetParam()), G = std::get<2>(GetParam());
  const TextConfig& c = cfg_.text;
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  dist::run_fake_ranks(P, [&](dist::Communicator& comm) {
    const int me = comm.rank(), g0 = dist::tp_group_first(me, G);
    auto ck = Checkpoint::open(tmp_.path());
    ASSERT_TRUE(ck) << ck.error().message();
    const std::string prefix = dense_prefix(*ck);
    ASSERT_FALSE(prefix.empty());
    ExpertShard shard{&comm, me, P, {}, G};
    Binder b(*ck);
    b.set_expert_shard(&shard);
    GatedMlp mlp;
    mlp.bind_dense(b, prefix, "gate_proj", "up_proj", "down_proj", D, I, c);
    ASSERT_TRUE(b.ok()) << b.status().message();
    ASSERT_TRUE(mlp.tensor_parallel());
    const int64_t T = tokens_of(me);
    const std::vector<float> x = rows_of(me, D);
    std::vector<float> y(static_cast<size_t>(T * D));
    mlp.forward(x.data(), T, y.data());

    // Serially: the group's rows in member order, each member's slice alone over all of them, then the
    // partials added in member order.
    std::vector<float> X;
    int64_t mine_at = 0, N = 0;
    for (int m = 0; m < G; ++m) {
      if (g0 + m == me) mine_at = N;
      const auto xm = rows_of(g0 + m, D);
      X.insert(X.end(), xm.begin(), xm.end());
      N += tokens_of(g0 + m);
    }
    std::vector<float> want(static_cast<size_t>(T * D), 0.0f);
    for (int m = 0; m < G; ++m) {
      auto ckm = Checkpoint::open(tmp_.path());
      ASSERT_TRUE(ckm) << ckm.error().message();
      ExpertShard sm{nullptr, g0 + m, P, {}, G};
      Binder bm(*ckm);
      bm.set_expert_shard(&sm);
      GatedMlp slice;
      slice.bind_dense(bm, prefix, "gate_proj", "up_proj", "down_proj", D, I, c);
      ASSERT_TRUE(bm.ok()) << bm.status().message();
      std::vector<float> part(static_cast<size_t>(N * D), 0.0f);
      const auto [i0, i1] = dist::tp_slice(I, ckm->contains(prefix + "gate_proj.weight_scale_inv") ? 128 : 1, G, m);
      if (i1 > i0 && N > 0) {
        std::vector<float> g(static_cast<size_t>(N * (i1 - i0))), u(g.size());
        std::vector<kernels::MatmulTask> tasks;
        slice.gate_up_tasks(X.data(), N, g.data(), u.data(), tasks);
        kernels::matmul_many(tasks);
        slice.activate(g.data(), u.data(), static_cast<int64_t>(g.size()));
        const kernels::MatmulTask down = slice.down_task(g.data(), N, part.data());
        kernels::matmul_many(std::span<const kernels::MatmulTask>(&down, 1));
      }
      for (int64_t i = 0; i < T * D; ++i) {
        const float p = part[static_cast<size_t>(mine_at * D + i)];
        want[static_cast<size_t>(i)] = m == 0 ? p : want[static_cast<size_t>(i)] + p;
      }
    }
    EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0)
        << "rank " << me << ": not the group-order sum of the members' partials";

    // The whole MLP in one process: within the stated tolerance (the down projection's sum over the intermediate
    // columns is split in G parts).
    auto ckf = Checkpoint::open(tmp_.path());
    ASSERT_TRUE(ckf) << ckf.error().message();
    Binder bf(*ckf);
    GatedMlp whole;
    whole.bind_dense(bf, prefix, "gate_proj", "up_proj", "down_proj", D, I, c);
    ASSERT_FALSE(whole.tensor_parallel());
    std::vector<float> ref(static_cast<size_t>(T * D));
    whole.forward(x.data(), T, ref.data());
    double scale = 1.0, diff = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
      diff = std::max(diff, static_cast<double>(std::fabs(ref[i] - y[i])));
    }
    EXPECT_LE(diff / scale, kTpLogitTolerance) << "rank " << me;
  });
}

INSTANTIATE_TEST_SUITE_P(Layers, TpMlp,
                         ::testing::Combine(::testing::Values("k3-tiny", "deepseek-v3-tiny"),
                                            ::testing::Values(4), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param);
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s + "_ranks" + std::to_string(std::get<1>(info.param)) + "_tp" +
                                  std::to_string(std::get<2>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(OneGroupOfThree, TpMlp,
                         ::testing::Combine(::testing::Values("k3-tiny", "deepseek-v3-tiny"), ::testing::Values(3),
                                            ::testing::Values(3)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param);
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s + "_ranks3_tp3";
                         });

// MXFP4 (K3's routed experts) cannot be sliced yet: refused naming the tensor and the format.
TEST(TpMlpFormats, Mxfp4IsRefusedByName) {
  TempDir tmp;
  make_checkpoint("k3-tiny", tmp.path());
  auto cfg = load_model_config(tmp.path());
  ASSERT_TRUE(cfg) << cfg.error().message();
  auto ck = Checkpoint::open(tmp.path());
  ASSERT_TRUE(ck) << ck.error().message();
  std::string prefix;
  for (const std::string& n : ck->names())
    if (n.size() > 21 && n.ends_with(".w1.weight_packed")) {
      prefix = n.substr(0, n.size() - std::string("w1.weight_packed").size());
      break;
    }
  ASSERT_FALSE(prefix.empty());
  ExpertShard shard{nullptr, 0, 2, {}, 2};
  Binder b(*ck);
  b.set_expert_shard(&shard);
  GatedMlp mlp;
  const TextConfig& c = cfg->text;
  mlp.bind_dense(b, prefix, "w1", "w3", "w2", c.latent_moe() ? c.routed_expert_hidden_size : c.hidden_size,
                 c.moe_intermediate_size, c);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not MXFP4"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find(prefix + "w1"), std::string::npos) << b.status().message();
}

// A slice of an FP8-block matrix that does not start on a 128-row / column block is refused, naming the tensor.
TEST(TpMlpFormats, Fp8SliceOffTheBlocksIsRefused) {
  TempDir tmp;
  make_checkpoint("deepseek-v3-tiny", tmp.path());
  auto cfg = load_model_config(tmp.path());
  ASSERT_TRUE(cfg) << cfg.error().message();
  const int64_t D = cfg->text.hidden_size, I = cfg->text.intermediate_size;
  for (bool rows : {true, false}) {
    auto ck = Checkpoint::open(tmp.path());
    ASSERT_TRUE(ck) << ck.error().message();
    const std::string name = dense_prefix(*ck) + (rows ? "gate_proj" : "down_proj");
    Binder b(*ck);
    std::vector<uint64_t> store;
    if (rows)
      b.linear_rows(name, I, D, 64, 128);
    else
      b.linear_cols(name, D, I, 64, 128, store);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("'" + name + "': slice [64, 128) of 384 is not on its 128-wide blocks"),
              std::string::npos)
        << b.status().message();
  }
}

}  // namespace
}  // namespace kestrel::testing
