// DeepSeek-family config + binding error paths (deepseek_v3 / kimi_k2 / deepseek_v32): the typed
// fields come out as the HF config states them, every bad key or tensor is one line naming the file
// and the key/tensor, and unsupported variants are refused with a reason.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>

#include "common/test_util.h"
#include "loader/deepseek_config.h"
#include "layers/rope.h"
#include "loader/model_config.h"
#include "runtime/engine.h"

namespace kestrel {
namespace {

using testing::TempDir;

std::string load_error(const std::string& dir) {
  auto e = Engine::load(dir);
  return e ? std::string() : e.error().message();
}

void expect_one_line_naming(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

class DeepseekConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::make_checkpoint("deepseek-v3-tiny", dir()); }
  std::string dir() const { return tmp_.sub("ckpt"); }
  std::string cfg_path() const { return dir() + "/config.json"; }
  void edit(const std::function<void(nlohmann::json&)>& f) {
    auto cfg = testing::read_json(cfg_path());
    f(cfg);
    testing::write_json(cfg_path(), cfg);
  }
  TempDir tmp_;
};

TEST_F(DeepseekConfigTest, TypedFieldsMatchTheFile) {
  auto c = load_model_config(dir());
  ASSERT_TRUE(c) << c.error().message();
  const TextConfig& t = c->text;
  EXPECT_EQ(c->arch, Arch::kDeepseekV3);
  EXPECT_EQ(c->lm_head_name, "lm_head.weight");
  EXPECT_EQ(t.q_lora_rank, 160);
  EXPECT_EQ(t.kv_lora_rank, 192);
  EXPECT_EQ(t.num_experts, 16);
  EXPECT_EQ(t.num_expert_group, 4);
  EXPECT_EQ(t.topk_group, 2);
  EXPECT_TRUE(t.router_bias);
  EXPECT_EQ(t.router_scoring, RouterScoring::kSigmoid);
  EXPECT_FLOAT_EQ(t.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(t.weights_fp8_block);
  EXPECT_EQ(t.num_nextn_predict_layers, 1);
  ASSERT_TRUE(t.mla_rope.has_value());
  EXPECT_TRUE(t.mla_rope->yarn);
  EXPECT_DOUBLE_EQ(t.mla_rope->factor, 40.0);
  EXPECT_EQ(t.mla_rope->original_max_position_embeddings, 4096);
  // 96^-0.5 · (0.1·ln 40 + 1)² — the value transformers prints for this config (0.19124944).
  EXPECT_NEAR(t.mla_softmax_scale, 0.19124944, 1e-7);
  EXPECT_EQ(t.ffn_kind, (std::vector<FfnKind>{FfnKind::kDense, FfnKind::kDense, FfnKind::kMoe, FfnKind::kMoe}));
  EXPECT_FLOAT_EQ(t.mla_q_norm_eps, 1e-6f);
}

TEST_F(DeepseekConfigTest, KimiK2TypeAndNullQLoraAndOldRopeKeysParse) {
  edit([](nlohmann::json& j) {
    j["model_type"] = "kimi_k2";
    j["q_lora_rank"] = nullptr;
    j["n_group"] = 1, j["topk_group"] = 1;
    j["rope_scaling"].erase("type");
    j["rope_scaling"]["rope_type"] = "yarn";
  });
  auto c = load_model_config(dir());
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->arch, Arch::kDeepseekV3);
  EXPECT_EQ(c->text.q_lora_rank, 0);
  EXPECT_TRUE(c->text.mla_rope->yarn);
}

TEST_F(DeepseekConfigTest, V32NeedsIndexKeys) {
  testing::make_checkpoint("deepseek-v32-tiny", dir());
  auto c = load_model_config(dir());
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->arch, Arch::kDeepseekV32);
  EXPECT_EQ(c->text.index_topk, 256);
  EXPECT_EQ(c->text.index_n_heads, 16);
  // Every layer carries an indexer; its rope dims are the MLA's.
  EXPECT_EQ(c->text.sparse_attn_layers.size(), static_cast<size_t>(c->text.num_hidden_layers));
  EXPECT_EQ(std::count(c->text.attn_sparse.begin(), c->text.attn_sparse.end(), true), c->text.num_hidden_layers);
  EXPECT_EQ(c->text.index_rope_head_dim, c->text.qk_rope_head_dim);
  for (const char* key : {"index_topk", "index_n_heads", "index_head_dim"}) {
    testing::make_checkpoint("deepseek-v32-tiny", dir());
    edit([&](nlohmann::json& j) { j.erase(key); });
    expect_one_line_naming(load_error(dir()), {"config.json", std::string("'") + key + "'", "missing required key"});
  }
  // The indexer needs one act_quant block per vector: head dim 128 only (loud, not a wrong result).
  testing::make_checkpoint("deepseek-v32-tiny", dir());
  edit([&](nlohmann::json& j) { j["index_head_dim"] = 64; });
  expect_one_line_naming(load_error(dir()), {"config.json", "'index_head_dim'", "only 128"});
}

TEST_F(DeepseekConfigTest, MissingAndBadKeysNameFileAndKey) {
  for (const char* key : {"kv_lora_rank", "qk_rope_head_dim", "hidden_size", "rms_norm_eps"}) {
    testing::make_checkpoint("deepseek-v3-tiny", dir());
    edit([&](nlohmann::json& j) { j.erase(key); });
    expect_one_line_naming(load_error(dir()), {"config.json", std::string("'") + key + "'", "missing required key"});
  }
  struct Bad {
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  for (const Bad& b : std::initializer_list<Bad>{{"topk_group", 5, "'topk_group'"},
                                                 {"n_group", 3, "'n_group'"},
                                                 {"qk_rope_head_dim", 31, "'qk_rope_head_dim'"},
                                                 {"num_experts_per_tok", 17, "'num_experts_per_tok'"},
                                                 {"scoring_func", "sqrtsoftplus", "'scoring_func'"},
                                                 {"topk_method", "weird", "'topk_method'"},
                                                 {"attention_bias", true, "'attention_bias'"},
                                                 {"rope_interleave", false, "'rope_interleave'"},
                                                 {"hidden_act", "gelu", "'hidden_act'"},
                                                 {"q_lora_rank", "big", "'q_lora_rank'"}}) {
    testing::make_checkpoint("deepseek-v3-tiny", dir());
    edit([&](nlohmann::json& j) { j[b.key] = b.value; });
    expect_one_line_naming(load_error(dir()), {"config.json", b.says});
  }
}

TEST_F(DeepseekConfigTest, RopeScalingErrors) {
  edit([](nlohmann::json& j) { j["rope_scaling"].erase("factor"); });
  expect_one_line_naming(load_error(dir()), {"config.json", "rope_scaling", "'factor'"});
  testing::make_checkpoint("deepseek-v3-tiny", dir());
  edit([](nlohmann::json& j) { j["rope_scaling"]["type"] = "longrope"; });
  expect_one_line_naming(load_error(dir()), {"config.json", "rope_scaling", "longrope", "not supported"});
  testing::make_checkpoint("deepseek-v3-tiny", dir());
  edit([](nlohmann::json& j) { j["rope_scaling"]["beta_fast"] = 0.5; });
  expect_one_line_naming(load_error(dir()), {"config.json", "rope_scaling", "beta_fast"});
}

TEST_F(DeepseekConfigTest, QuantizationConfigErrors) {
  edit([](nlohmann::json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; });
  expect_one_line_naming(load_error(dir()), {"config.json", "'weight_block_size'", "[128, 128]"});
  testing::make_checkpoint("deepseek-v3-tiny", dir());
  edit([](nlohmann::json& j) { j["quantization_config"]["quant_method"] = "compressed-tensors"; });
  expect_one_line_naming(load_error(dir()), {"config.json", "compressed-tensors", "not supported"});
  testing::make_checkpoint("deepseek-v3-tiny", dir());
  edit([](nlohmann::json& j) { j["quantization_config"]["activation_scheme"] = "static"; });
  expect_one_line_naming(load_error(dir()), {"config.json", "'activation_scheme'"});
}

TEST_F(DeepseekConfigTest, Fp8ScaleShapeAndMissingScaleAreNamed) {
  const std::string w = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight";
  const std::string s = w + "_scale_inv";
  const std::string shard = testing::shard_of(dir(), s);
  testing::edit_header(shard, [&](nlohmann::json& j) {
    auto sh = j[s]["shape"];  // [2, 2] → [4, 1]: same byte span, wrong grid
    j[s]["shape"] = {sh[0].get<int64_t>() * 2, sh[1].get<int64_t>() / 2};
  });
  expect_one_line_naming(load_error(dir()), {shard, s});
  // An FP8 scale next to a weight that is not e4m3 (here U8, same bytes) is refused by dtype.
  testing::make_checkpoint("deepseek-v3-tiny", dir());
  const std::string shard2 = testing::shard_of(dir(), w);
  testing::edit_header(shard2, [&](nlohmann::json& j) { j[w]["dtype"] = "U8"; });
  expect_one_line_naming(load_error(dir()), {shard2, w});
}

TEST_F(DeepseekConfigTest, MtpTensorsAcceptedOnlyWhenDeclared) {
  EXPECT_EQ(load_error(dir()), "");  // num_nextn_predict_layers 1: model.layers.4.* is the MTP layer
  edit([](nlohmann::json& j) { j["num_nextn_predict_layers"] = 0; });
  expect_one_line_naming(load_error(dir()), {"model.layers.4.", "unexpected tensor"});
}

// The released DeepSeek-V3 config.json (HF deepseek-ai/DeepSeek-V3, auto_map dropped) and the Kimi K2
// keys that differ (docs/model-math.md §5.1). Derived constants are those of docs/model-math.md §5.1: softmax scale
// 192^-0.5 · mscale² = 0.135234 (V3) and 0.130861 (K2).
const char* kDeepseekV3Released = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

TEST(DeepseekReleasedConfigs, DeepseekV3) {
  auto c = parse_model_config(kDeepseekV3Released, "config.json");
  ASSERT_TRUE(c) << c.error().message();
  const TextConfig& t = c->text;
  EXPECT_EQ(t.num_hidden_layers, 61);
  EXPECT_EQ(t.num_expert_group, 8);
  EXPECT_EQ(t.topk_group, 4);
  EXPECT_NEAR(t.mla_softmax_scale, 0.135234, 1e-6);
  EXPECT_EQ(t.ffn_kind[2], FfnKind::kDense);
  EXPECT_EQ(t.ffn_kind[3], FfnKind::kMoe);
  EXPECT_TRUE(t.weights_fp8_block);
  // YaRN ramp low/high = 10/23 (docs/model-math.md §5.1): pairs ≤ 10 keep the original frequency, ≥ 23 are ÷ 40.
  const MlaRope rope(*t.mla_rope, 64);
  EXPECT_FLOAT_EQ(rope.inv_freq()[10], std::pow(10000.0f, -20.0f / 64.0f));
  EXPECT_FLOAT_EQ(rope.inv_freq()[23], std::pow(10000.0f, -46.0f / 64.0f) / 40.0f);
  EXPECT_FLOAT_EQ(rope.magnitude(), 1.0f);
}

TEST(DeepseekReleasedConfigs, KimiK2) {
  auto j = nlohmann::json::parse(kDeepseekV3Released);
  j["model_type"] = "kimi_k2", j["num_attention_heads"] = 64, j["num_key_value_heads"] = 64;
  j["n_routed_experts"] = 384, j["n_group"] = 1, j["topk_group"] = 1, j["first_k_dense_replace"] = 1;
  j["routed_scaling_factor"] = 2.827, j["rope_theta"] = 50000.0, j["vocab_size"] = 163840;
  j["bos_token_id"] = 163584, j["eos_token_id"] = 163585, j["num_nextn_predict_layers"] = 0;
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = {{"beta_fast", 1.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}, {"type", "yarn"}};
  auto c = parse_model_config(j.dump(), "config.json");
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->arch, Arch::kDeepseekV3);
  EXPECT_NEAR(c->text.mla_softmax_scale, 0.130861, 1e-6);
  EXPECT_EQ(c->text.eos_token_id, 163585);
  // beta_fast == beta_slow: a hard switch between pairs 19 and 20 (low == high → high += 0.001).
  // Values from transformers' _compute_yarn_parameters for this config (fp32).
  const MlaRope rope(*c->text.mla_rope, 64);
  const std::pair<int, float> want[] = {{0, 1.0f},          {1, 0.7131111025810242f},     {18, 0.0022742038127034903f},
                                        {19, 0.0016217599622905254f}, {20, 3.614046727307141e-05f},
                                        {21, 2.577216764620971e-05f}, {31, 8.764412768869079e-07f}};
  for (auto [i, v] : want) EXPECT_NEAR(rope.inv_freq()[static_cast<size_t>(i)], v, 2e-6f * v) << i;
}

// DeepSeek-V3.2-Exp's config: V3 keys + index_* and an fp8 quantization_config with scale_fmt ue8m0
// (the weight scales are still fp32 weight_scale_inv; ue8m0 concerns the reference's activation quant).
TEST(DeepseekReleasedConfigs, DeepseekV32Exp) {
  auto j = nlohmann::json::parse(kDeepseekV3Released);
  j["architectures"] = {"DeepseekV32ForCausalLM"}, j["model_type"] = "deepseek_v32";
  j["index_head_dim"] = 128, j["index_n_heads"] = 64, j["index_topk"] = 2048;
  j["quantization_config"]["scale_fmt"] = "ue8m0";
  auto c = parse_model_config(j.dump(), "config.json");
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->arch, Arch::kDeepseekV32);
  EXPECT_EQ(c->text.index_topk, 2048);
  EXPECT_EQ(c->text.index_head_dim, 128);
  EXPECT_NEAR(c->text.mla_softmax_scale, 0.135234, 1e-6);
}

TEST(YarnMscale, MatchesFormula) {
  EXPECT_DOUBLE_EQ(yarn_mscale(1.0, 1.0), 1.0);
  EXPECT_NEAR(yarn_mscale(40.0, 1.0), 1.368888, 1e-6);  // docs/model-math.md §5.1: DSV3 mscale 1.36889
  EXPECT_NEAR(yarn_mscale(32.0, 1.0), 1.346574, 1e-6);  // Kimi K2: 1.34657
}

}  // namespace
}  // namespace kestrel
