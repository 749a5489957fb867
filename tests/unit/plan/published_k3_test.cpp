// The plan's model arithmetic for the full-size K3 config against the published figures collected in
// docs/model-math.md §10 (independent: tensor tables dumped from the real checkpoint and
// serving-engine shapes, not our code). Tolerances are the rounding of the published figure.
#include <gtest/gtest.h>

#include "plan/inventory.h"
#include "plan/model_costs.h"
#include "plan/planner.h"
#include "plan_test_util.h"

namespace kestrel::plan {
namespace {

using testing::config_of;
constexpr double kGiB = 1024.0 * 1024 * 1024, kMiB = 1024.0 * 1024;

struct K3 {
  ModelConfig cfg = config_of("kimi-k3");
  Inventory inv = *build_inventory(cfg, {});
  ModelCosts m = compute_costs(cfg, inv, {});
};

int64_t comp(const ModelCosts& m, Component c, bool bytes = false) {
  const auto& t = m.by_component[static_cast<size_t>(c)];
  return bytes ? t.bytes : t.params;
}

// docs/model-math.md §10.1: 497,220 tensors, 1453.7 GiB download, 2.78 T params (2.7795e12 text + 0.447e9 vision),
// ≈104 B active per token.
TEST(PlanPublishedK3, CheckpointTotals) {
  K3 k;
  EXPECT_TRUE(k.inv.vision_counted) << k.inv.vision_note;
  EXPECT_EQ(k.m.total_tensors, 497220);                                     // exact count from the shard headers
  EXPECT_NEAR(static_cast<double>(k.m.total_bytes) / kGiB, 1453.7, 0.05);   // "≈1453.7 GiB"
  EXPECT_NEAR(static_cast<double>(k.m.total_bytes) / 1e12, 1.56, 0.005);    // "1.56 TB"
  const int64_t vision = comp(k.m, Component::kVision);
  EXPECT_NEAR(static_cast<double>(k.m.total_params - vision), 2.7795e12, 0.00005e12);
  EXPECT_NEAR(static_cast<double>(vision), 0.447e9, 0.0005e9);
  EXPECT_NEAR(static_cast<double>(k.m.active_params), 104e9, 0.5e9);  // "≈104 B active"
}

// docs/model-math.md §1.5: one expert = 3 × 3584 × 3072 = 33,030,144 params = 17,547,264 B in MXFP4; 92 × 896 experts;
// §10.1: routed-expert bytes ≈ 1.446e12 ("the 1.42/1.44 TB figures count experts only").
TEST(PlanPublishedK3, Experts) {
  K3 k;
  EXPECT_EQ(k.m.expert_params, 33030144);
  EXPECT_EQ(k.m.expert_bytes, 17547264);
  EXPECT_EQ(k.m.moe_layers, 92);
  EXPECT_EQ(k.m.num_experts, 896);
  EXPECT_NEAR(static_cast<double>(comp(k.m, Component::kRoutedExperts, true)), 1.446e12, 0.0005e12);
  EXPECT_EQ(k.m.kda_layers, 69);
  EXPECT_EQ(k.m.mla_layers, 24);
}

// docs/model-math.md §2.7: MLA cache 576 elements × 24 layers = 27,648 B/token bf16 (27 GiB per 1M-token request),
// 13,824 B fp8 at one byte per element (vLLM's fp8; Kestrel's fp8 row adds 4 tile scales and keeps the rope part
// in bf16: 656 B per layer, 15,744 B/token); KDA per request at TP1: 6 MiB fp32 recurrent + 216 KiB bf16 conv per layer →
// 414 MiB + 14.6 MiB over 69 layers.
TEST(PlanPublishedK3, CacheAndState) {
  K3 k;
  EXPECT_EQ(k.m.cache_bytes_per_token(), 27648);
  EXPECT_NEAR(27648.0 * (1 << 20) / kGiB, 27.0, 1e-9);
  EXPECT_EQ(k.m.kda_recurrent_bytes, 69LL * 6 * (1 << 20));
  EXPECT_EQ(k.m.kda_conv_bytes, 69LL * 216 * 1024);
  EXPECT_NEAR(static_cast<double>(k.m.kda_recurrent_bytes) / kMiB, 414, 0.5);
  EXPECT_NEAR(static_cast<double>(k.m.kda_conv_bytes) / kMiB, 14.6, 0.05);
  // §2.7 (vLLM blog): "One KDA layer's state is roughly the MLA cache for a few thousand tokens".
  const double kda_layer = static_cast<double>(k.m.state_bytes_per_request()) / k.m.kda_layers;
  const double tokens = kda_layer / static_cast<double>(k.m.mla_bytes_per_token_per_layer);
  EXPECT_GT(tokens, 2000);
  EXPECT_LT(tokens, 10000);
  const ModelCosts fp8 = compute_costs(k.cfg, k.inv, {KvCacheDtype::kFP8, StateDType::kBF16, StateDType::kF32});
  EXPECT_EQ(fp8.cache_bytes_per_token(), 13824 + 24 * (4 * 4 + 64));
}

// docs/model-math.md §10.2: "Minimum: one 8×B300 / GB300 node, or 16×B200" — with the default 0.9 utilization and
// 4 GiB reserve the weights fit on 8 × B300 and 16 × B200 but not on 8 × B200.
TEST(PlanPublishedK3, MinimumDeployments) {
  K3 k;
  auto fits = [&](const char* accel, int tp_ep) {
    ClusterSpec c = *cluster_preset(accel);
    c.context = 8192;
    c.prefill.tp = c.prefill.ep = c.decode.tp = c.decode.ep = tp_ep;
    auto p = make_plan(k.cfg, "k3", c);
    EXPECT_TRUE(p.has_value()) << p.error().message();
    return p->decode.weight_bytes <= p->decode.usable_bytes;
  };
  EXPECT_TRUE(fits("b300", 8));
  EXPECT_TRUE(fits("gb300", 8));
  EXPECT_FALSE(fits("b200", 8));
  EXPECT_TRUE(fits("b200", 16));
  EXPECT_FALSE(fits("h200", 8));
}

// docs/model-math.md §10.3: measured throughput must not beat the roofline (a roofline is an upper bound), and the
// roofline must not be absurdly loose (within 10× of what was measured).
// 8×B300 sglang TP8 MXFP4, bs=1, 8192/1024: TPOT 8.57 ms.
TEST(PlanPublishedK3, Bs1DecodeRooflineBoundsMeasuredTpot) {
  K3 k;
  ClusterSpec c = *cluster_preset("b300");
  c.context = 8192 + 512;  // mid-generation of an 8192/1024 request
  c.prefill.nodes = 0, c.decode.nodes = 1;
  c.decode.tp = c.decode.ep = 8;
  c.decode.batch = 1;
  auto p = make_plan(k.cfg, "k3", c);
  ASSERT_TRUE(p.has_value()) << p.error().message();
  const double tpot_ms = p->decode.step_s * 1e3;
  EXPECT_LT(tpot_ms, 8.57);
  EXPECT_GT(tpot_ms, 0.857);
}

// 4×GB200 trays (16 GPUs) decode, sglang DCP16 + EP16: 136.1 out tok/s/GPU at concurrency 256,
// 153.5 at 512 (ISL/OSL not given; 8K-token history assumed).
TEST(PlanPublishedK3, BatchedDecodeRooflineBoundsMeasured) {
  K3 k;
  for (auto [batch, measured] : {std::pair{256, 136.1}, std::pair{512, 153.5}}) {
    ClusterSpec c = *cluster_preset("gb200");
    c.context = 8192;
    c.prefill.nodes = 0, c.decode.nodes = 4;
    c.decode.tp = 16, c.decode.ep = 16, c.decode.dcp = 16, c.decode.batch = batch;
    auto p = make_plan(k.cfg, "k3", c);
    ASSERT_TRUE(p.has_value()) << p.error().message();
    EXPECT_TRUE(p->decode.fits) << p->decode.note;
    EXPECT_GT(p->decode.decode_tokens_per_s_gpu, measured);
    EXPECT_LT(p->decode.decode_tokens_per_s_gpu, 10 * measured);
  }
}

// K3.1-style config (ours): every full-attention layer sparse, DeepSeek-V3.2 indexer sizes.
TEST(PlanPublishedK3, K31StyleAddsIndexerOnly) {
  K3 k;
  const ModelConfig c31 = config_of("kimi-k3.1-style");
  auto inv = build_inventory(c31, {});
  ASSERT_TRUE(inv.has_value());
  const ModelCosts m = compute_costs(c31, *inv, {});
  EXPECT_EQ(m.sparse_layers, 24);
  // indexer per layer: wq_b 64·128×1536 + wk 128×7168 + k_norm 2×128 + weights_proj 64×7168
  const int64_t per_layer = 64 * 128 * 1536 + 128 * 7168 + 256 + 64 * 7168;
  EXPECT_EQ(comp(m, Component::kIndexer), 24 * per_layer);
  EXPECT_EQ(m.total_params - k.m.total_params, 24 * per_layer);
  EXPECT_EQ(m.cache_bytes_per_token(), 27648 + 24 * 132);  // + fp8 key + fp32 scale per sparse layer
  // At 1M context sparse attention reads top-2048 rows instead of the whole history.
  EXPECT_LT(m.mla_sparse_flops(1 << 20) + m.mla_dense_flops(1 << 20, true), k.m.mla_dense_flops(1 << 20, true) / 100);
}

}  // namespace
}  // namespace kestrel::plan
