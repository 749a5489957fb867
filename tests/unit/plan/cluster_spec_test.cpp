// Cluster JSON parsing: the documented example parses to the documented values, and every bad spec
// is a one-line error naming the key.
#include <gtest/gtest.h>

#include "plan/cluster.h"
#include "plan_test_util.h"

namespace kestrel::plan {
namespace {

std::string parse_error(const std::string& text) {
  auto c = parse_cluster_spec(text, "spec.json");
  EXPECT_FALSE(c.has_value()) << text;
  if (c.has_value()) return "";
  EXPECT_EQ(c.error().message().find('\n'), std::string::npos);
  EXPECT_EQ(c.error().message().rfind("spec.json: ", 0), 0u) << c.error().message();
  return c.error().message();
}

TEST(PlanClusterSpec, ExampleFileParses) {
  const std::string path = std::string(KESTREL_SOURCE_DIR) + "/docs/configs/cluster-h200-4p4d.json";
  auto c = parse_cluster_spec(testing::read_text(path), path);
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->accel.name, "h200");
  EXPECT_DOUBLE_EQ(c->accel.hbm_bytes, 141e9);
  EXPECT_DOUBLE_EQ(c->accel.hbm_bw, 4.8e12);
  EXPECT_EQ(c->prefill.nodes, 4);
  EXPECT_EQ(c->decode.tp, 16);
  EXPECT_EQ(c->decode.dcp, 16);
  EXPECT_EQ(c->context, 1 << 20);
  EXPECT_DOUBLE_EQ(c->a.reserve_bytes, 4.0 * (1 << 30));
  EXPECT_EQ(c->a.state.kv, KvCacheDtype::kBF16);
  EXPECT_TRUE(validate(*c, testing::config_of("kimi-k3")).is_ok());
}

TEST(PlanClusterSpec, CustomAcceleratorAndPresetOverride) {
  auto c = parse_cluster_spec(R"({"accelerator": {"name": "x", "hbm_gb": 96, "hbm_tb_s": 4, "bf16_tflops": 500,
      "fp8_tflops": 1000, "nvlink_gb_s": 300, "network_gb_s": 25}, "gpus_per_node": 4})", "spec.json");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_DOUBLE_EQ(c->accel.hbm_bytes, 96e9);
  EXPECT_DOUBLE_EQ(c->accel.fp8_flops, 1e15);
  EXPECT_EQ(c->gpus_per_node, 4);
  auto d = parse_cluster_spec(R"({"accelerator": {"preset": "h100", "hbm_gb": 94}})", "spec.json");
  ASSERT_TRUE(d.has_value()) << d.error().message();
  EXPECT_DOUBLE_EQ(d->accel.hbm_bytes, 94e9);
  EXPECT_DOUBLE_EQ(d->accel.hbm_bw, 3.35e12);  // the rest from the preset
}

TEST(PlanClusterSpec, MeasuredTransferThroughput) {
  auto c = parse_cluster_spec(R"({"accelerator": "h200", "assumptions": {"transfer_gb_s": 3.25}})", "spec.json");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_DOUBLE_EQ(c->a.transfer_bw, 3.25e9);
  EXPECT_DOUBLE_EQ(parse_cluster_spec(R"({"accelerator": "h200"})", "spec.json")->a.transfer_bw, 0);  // roofline
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "assumptions": {"transfer_gb_s": -1}})")
                .find("'assumptions.transfer_gb_s': -1 is outside"),
            std::string::npos);
}

TEST(PlanClusterSpec, BadSpecsAreClearErrors) {
  EXPECT_NE(parse_error("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("[]").find("must be an object"), std::string::npos);
  EXPECT_NE(parse_error("{}").find("key 'accelerator': missing"), std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "tpu9"})").find("unknown preset 'tpu9'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": 7})").find("'accelerator': must be an object"), std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "decod": {}})").find("key 'decod': unknown key"), std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "decode": {"tpp": 8}})").find("key 'decode.tpp': unknown key"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "decode": {"tp": "8"}})").find("'decode.tp': must be an integer"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "decode": {"tp": 0}})").find("'decode.tp': 0 is outside 1.."),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "prefill": {"nodes": -1}})").find("'prefill.nodes'"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "context": 0})").find("'context': 0 is outside"), std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "context": 1.5})").find("'context': must be an integer"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "assumptions": {"mfu": 1.5}})").find("'assumptions.mfu': 1.5"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "assumptions": {"kv_cache_dtype": "int3"}})")
                .find("'assumptions.kv_cache_dtype': must be one of bf16, fp32, fp8"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": "h200", "assumptions": {"expert_format": "nvfp4"}})")
                .find("'assumptions.expert_format'"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": {"name": "x", "hbm_gb": 80}})").find("'accelerator.hbm_tb_s': missing"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": {"preset": "h100", "hbm_gb": -80}})").find("'accelerator.hbm_gb': -80"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": {"preset": "h100", "hbm_tb_s": 1e400}})").find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"accelerator": {"preset": "h100", "name": 5}})").find("'accelerator.name': must be a string"),
            std::string::npos);
}

TEST(PlanClusterSpec, Presets) {
  for (const std::string& n : accelerator_preset_names()) {
    auto c = cluster_preset(n);
    ASSERT_TRUE(c.has_value()) << n;
    EXPECT_EQ(c->prefill.nodes * c->gpus_per_node, 32) << n;  // 4 + 4 nodes of 8 GPUs (or 8 + 8 trays of 4)
    EXPECT_GT(c->accel.fp8_flops, c->accel.bf16_flops) << n;
  }
  auto bad = cluster_preset("tpu");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("known: h100, h200, b200, b300, gb200, gb300"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::plan
