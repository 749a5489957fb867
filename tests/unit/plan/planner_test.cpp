// Planner invariants (TP/EP splitting, capacity, roofline consistency) and the JSON output schema.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "plan/plan_output.h"
#include "plan/planner.h"
#include "plan_test_util.h"

namespace kestrel::plan {
namespace {

using testing::config_of;

Plan plan_k3(const std::function<void(ClusterSpec&)>& edit, const char* model = "kimi-k3") {
  ClusterSpec c = *cluster_preset("b300");
  edit(c);
  auto p = make_plan(config_of(model), model, c);
  if (!p) throw std::runtime_error(p.error().message());
  return *p;
}

double placed(const ModelCosts& m, Placement pl) {
  double s = 0;
  for (const auto& b : m.placement)
    s += static_cast<double>(pl == Placement::kReplicated ? b.replicated : pl == Placement::kTensor ? b.tensor : b.expert);
  return s;
}

TEST(PlanPlanner, TensorParallelSplitsOnlyShardedWeights) {
  double prev = 1e300;
  for (int tp : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96}) {
    SCOPED_TRACE(tp);
    const Plan p = plan_k3([&](ClusterSpec& c) {
      c.gpus_per_node = 96, c.prefill.nodes = c.decode.nodes = 1;
      c.prefill.tp = c.decode.tp = tp, c.prefill.ep = c.decode.ep = 96;
    });
    const RolePlan& r = p.decode;
    EXPECT_DOUBLE_EQ(r.weight_replicated, placed(p.costs, Placement::kReplicated));  // norms etc. on every device
    EXPECT_NEAR(r.weight_tensor * tp, placed(p.costs, Placement::kTensor), 1.0);     // shards sum to the whole
    EXPECT_LT(r.weight_bytes, prev);
    prev = r.weight_bytes;
    EXPECT_EQ(r.dp_attn, 96 / tp);
  }
}

TEST(PlanPlanner, ExpertParallelSpreadsWholeExperts) {
  for (int ep : {1, 2, 4, 8, 16, 32, 64, 128}) {
    SCOPED_TRACE(ep);
    const Plan p = plan_k3([&](ClusterSpec& c) {
      c.gpus_per_node = 8, c.prefill.nodes = c.decode.nodes = std::max(1, ep / 8);
      c.prefill.tp = c.decode.tp = 1, c.prefill.ep = c.decode.ep = ep;
    });
    const double total = placed(p.costs, Placement::kExpert);
    const double one_expert_all_layers = static_cast<double>(p.costs.expert_bytes) * p.costs.moe_layers;
    EXPECT_GE(p.decode.weight_expert * ep, total - 1.0);
    EXPECT_LT(p.decode.weight_expert * ep, total + one_expert_all_layers * ep);  // ≤ one extra expert per rank
    EXPECT_EQ(p.decode.instance_devices, ep);
  }
}

TEST(PlanPlanner, CapacityAndRooflineAreConsistent) {
  const Plan p = plan_k3([](ClusterSpec& c) { c.prefill.tp = c.decode.tp = 8, c.decode.dcp = 8; });
  for (const RolePlan* r : {&p.prefill, &p.decode}) {
    SCOPED_TRACE(r->role);
    ASSERT_TRUE(r->fits) << r->note;
    EXPECT_NEAR(r->cache_bytes, r->usable_bytes - r->weight_bytes, 1.0);
    EXPECT_LE(static_cast<double>(r->requests_per_instance) / r->dp_attn * r->request_bytes_device, r->cache_bytes);
    EXPECT_GT(static_cast<double>(r->requests_per_instance / r->dp_attn + 1) * r->request_bytes_device, r->cache_bytes);
    EXPECT_EQ(r->requests_per_role, r->requests_per_instance * r->instances);
  }
  const RolePlan& d = p.decode;
  EXPECT_EQ(d.batch, d.requests_per_instance);
  EXPECT_DOUBLE_EQ(d.step_s, std::max({d.t_memory, d.t_compute, d.t_comm}));
  EXPECT_NEAR(d.decode_tokens_per_s_instance, static_cast<double>(d.batch) / d.step_s, 1e-6);
  EXPECT_NEAR(d.decode_tokens_per_s_role, d.decode_tokens_per_s_instance * d.instances, 1e-6);
  EXPECT_NEAR(p.prefill.prefill_tokens_per_s_role, p.prefill.prefill_tokens_per_s_instance * p.prefill.instances, 1e-6);
}

TEST(PlanPlanner, LongerContextAndNoDcpHoldFewerRequests) {
  auto reqs = [](int64_t ctx, int dcp) {
    return plan_k3([&](ClusterSpec& c) { c.context = ctx, c.decode.dcp = dcp; }).decode.requests_per_instance;
  };
  EXPECT_GT(reqs(131072, 1), reqs(1 << 20, 1));
  EXPECT_GT(reqs(1 << 20, 8), reqs(1 << 20, 1));
  // Prefill FLOPs per token grow with the prompt (attention over the history).
  const Plan a = plan_k3([](ClusterSpec& c) { c.context = 8192; });
  const Plan b = plan_k3([](ClusterSpec& c) { c.context = 1 << 20; });
  EXPECT_GT(b.prefill.prefill_flops_per_token, 3 * a.prefill.prefill_flops_per_token);
}

TEST(PlanPlanner, SparseLayersHelpLongContextDecode) {
  auto step = [](const char* model) {
    return plan_k3([](ClusterSpec& c) { c.decode.dcp = 8, c.decode.batch = 4; }, model).decode.step_cache_bytes;
  };
  EXPECT_LT(step("kimi-k3.1-style"), step("kimi-k3") / 5);
}

TEST(PlanPlanner, DoesNotFitIsReportedNotThrown) {
  ClusterSpec c = *cluster_preset("h200");  // 8 × H200 cannot hold K3 at TP8/EP8
  auto p = make_plan(config_of("kimi-k3"), "k3", c);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->decode.fits);
  EXPECT_NE(p->decode.note.find("weights need"), std::string::npos) << p->decode.note;
  EXPECT_EQ(p->decode.batch, 0);
  EXPECT_EQ(p->decode.decode_tokens_per_s_instance, 0);
}

TEST(PlanPlanner, RejectsLayoutsTheModelCannotUse) {
  const ModelConfig k3 = config_of("kimi-k3");
  auto err = [&](const std::function<void(ClusterSpec&)>& edit) {
    ClusterSpec c = *cluster_preset("b300");
    edit(c);
    auto p = make_plan(k3, "k3", c);
    EXPECT_FALSE(p.has_value());
    return p.has_value() ? std::string() : p.error().message();
  };
  EXPECT_NE(err([](ClusterSpec& c) { c.decode.tp = 5; }).find("must divide the attention heads (96)"), std::string::npos);
  EXPECT_NE(err([](ClusterSpec& c) { c.decode.tp = 8, c.decode.ep = 12; }).find("must divide the other"), std::string::npos);
  EXPECT_NE(err([](ClusterSpec& c) { c.decode.dcp = 3; }).find("dcp 3 must divide tp 8"), std::string::npos);
  EXPECT_NE(err([](ClusterSpec& c) { c.decode.ep = 64; }).find("does not divide its 32 GPUs"), std::string::npos);
  EXPECT_NE(err([](ClusterSpec& c) { c.prefill.nodes = c.decode.nodes = 0; }).find("no prefill or decode"), std::string::npos);
  EXPECT_NE(err([](ClusterSpec& c) { c.a.mfu = 0; }).find("assumptions"), std::string::npos);
}

// The planner models KDA / MLA checkpoints only: a grouped-query attention model is refused by name, not planned
// as a model with no attention cache.
TEST(PlanPlanner, RefusesArchitecturesItDoesNotModel) {
  auto cfg = parse_model_config(R"({"model_type": "qwen3_moe", "vocab_size": 1024, "hidden_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
      "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": true})", "test");
  ASSERT_TRUE(cfg) << cfg.error().message();
  auto p = make_plan(*cfg, "qwen3", *cluster_preset("h200"));
  ASSERT_FALSE(p.has_value());
  EXPECT_NE(p.error().message().find("grouped-query attention (Qwen3-MoE) is not modelled"), std::string::npos)
      << p.error().message();
}

// A measured hand-off throughput (--transfer-gbps, assumptions.transfer_gb_s) replaces the NIC roofline in the
// P->D transfer time of K3 and the K3.1-style config on 4P+4D: time = bytes / (links x measured), so doubling
// the measured figure halves the time exactly; nothing else in the plan depends on it.
TEST(PlanPlanner, MeasuredTransferThroughputSetsTheHandoffTime) {
  for (const char* model : {"kimi-k3", "kimi-k3.1-style"}) {
    SCOPED_TRACE(model);
    const Plan roof = plan_k3([](ClusterSpec& c) { c.decode.dcp = 8; }, model);
    const Plan x1 = plan_k3([](ClusterSpec& c) { c.decode.dcp = 8, c.a.transfer_bw = 2.5e9; }, model);
    const Plan x2 = plan_k3([](ClusterSpec& c) { c.decode.dcp = 8, c.a.transfer_bw = 5e9; }, model);
    ASSERT_EQ(x1.prefill.spec.nodes, 4);
    ASSERT_EQ(x1.decode.spec.nodes, 4);
    EXPECT_FALSE(roof.transfer_measured);
    EXPECT_DOUBLE_EQ(roof.transfer_link_bw, roof.cluster.accel.network_bw * roof.cluster.a.comm_efficiency);
    EXPECT_TRUE(x1.transfer_measured);
    EXPECT_DOUBLE_EQ(x1.transfer_link_bw, 2.5e9);
    EXPECT_DOUBLE_EQ(x1.transfer_bytes_per_request, roof.transfer_bytes_per_request);
    EXPECT_DOUBLE_EQ(x1.transfer_s, x1.transfer_bytes_per_request / (x1.prefill.instance_devices * 2.5e9));
    EXPECT_DOUBLE_EQ(x1.transfer_s, 2 * x2.transfer_s);
    EXPECT_NE(x1.transfer_s, roof.transfer_s);
    EXPECT_DOUBLE_EQ(x1.prefill.ttft_s, roof.prefill.ttft_s);
    EXPECT_DOUBLE_EQ(x1.decode.step_s, roof.decode.step_s);
    const nlohmann::json j = nlohmann::json::parse(plan_json(x1));
    EXPECT_EQ(j.at("transfer").at("source"), "measured");
    EXPECT_DOUBLE_EQ(j.at("transfer").at("seconds_per_request").get<double>(), x1.transfer_s);
    EXPECT_DOUBLE_EQ(j.at("cluster").at("assumptions").at("transfer_bytes_per_s").get<double>(), 2.5e9);
    EXPECT_EQ(nlohmann::json::parse(plan_json(roof)).at("transfer").at("source"), "roofline");
  }
}

// Schema "kestrel.plan/1": the keys scripts rely on, with their types, and values equal to the plan.
TEST(PlanOutput, JsonSchema) {
  const Plan p = plan_k3([](ClusterSpec& c) { c.decode.dcp = 8; }, "kimi-k3.1-style");
  const nlohmann::json j = nlohmann::json::parse(plan_json(p));
  EXPECT_EQ(j.at("schema"), "kestrel.plan/1");
  const auto& m = j.at("model");
  for (const char* k : {"params", "bytes", "tensors", "active_params_per_token"}) EXPECT_TRUE(m.at(k).is_number_integer()) << k;
  EXPECT_EQ(m.at("params").get<int64_t>(), p.costs.total_params);
  EXPECT_EQ(m.at("expert_format"), "mxfp4");
  EXPECT_TRUE(m.at("vision_counted").is_boolean());
  for (const char* k : {"embedding", "lm_head", "norms", "kda", "mla", "indexer", "dense_mlp", "router", "latent_proj",
                        "shared_experts", "routed_experts", "vision"}) {
    const auto& c = m.at("components").at(k);
    EXPECT_EQ(c.at("bytes").get<int64_t>(),
              c.at("bytes_replicated").get<int64_t>() + c.at("bytes_tensor_parallel").get<int64_t>() +
                  c.at("bytes_expert_parallel").get<int64_t>()) << k;
  }
  EXPECT_EQ(m.at("layers").at("sparse"), 24);
  EXPECT_EQ(m.at("cache").at("bytes_per_token"), 27648 + 24 * 132);
  // A prefix-cache snapshot holds one request's KDA state: 69 layers x (recurrent 6 MiB + conv 216 KiB) at K3 widths.
  EXPECT_EQ(m.at("cache").at("prefix_snapshot_bytes").get<int64_t>(), 69LL * (6 * (1 << 20) + 216 * 1024));
  const auto& a = j.at("cluster").at("assumptions");
  for (const char* k : {"memory_utilization", "reserve_bytes", "mfu", "bandwidth_efficiency", "comm_efficiency"})
    EXPECT_TRUE(a.at(k).is_number()) << k;
  EXPECT_EQ(j.at("cluster").at("context"), 1 << 20);
  for (const char* role : {"prefill", "decode"}) {
    const auto& r = j.at("roles").at(role);
    for (const char* k : {"nodes", "devices", "tp", "ep", "dcp", "dp_attention", "instance_devices", "instances"})
      EXPECT_TRUE(r.at(k).is_number_integer()) << role << "." << k;
    EXPECT_TRUE(r.at("fits").is_boolean());
    EXPECT_TRUE(r.at("note").is_string());
    for (const char* k : {"weights_bytes", "usable_bytes", "cache_bytes"}) EXPECT_TRUE(r.at("memory_per_device").at(k).is_number());
    for (const char* k : {"tokens_per_device", "tokens_per_instance", "requests_per_instance", "requests_per_role"})
      EXPECT_TRUE(r.at("capacity").at(k).is_number()) << k;
  }
  const auto& pre = j.at("roles").at("prefill").at("prefill");
  EXPECT_DOUBLE_EQ(pre.at("tokens_per_s_per_instance").get<double>(), p.prefill.prefill_tokens_per_s_instance);
  EXPECT_TRUE(pre.at("ttft_s").is_number());
  const auto& dec = j.at("roles").at("decode").at("decode");
  for (const char* k : {"batch_per_instance", "step_s", "t_memory_s", "t_compute_s", "t_comm_s", "tokens_per_s_per_gpu",
                        "tokens_per_s_per_user"})
    EXPECT_TRUE(dec.at(k).is_number()) << k;
  EXPECT_EQ(dec.at("batch_per_instance").get<long long>(), p.decode.batch);
  EXPECT_TRUE(j.at("transfer").at("bytes_per_request").is_number());
  EXPECT_FALSE(plan_table(p).empty());
}

}  // namespace
}  // namespace kestrel::plan
