// gpt-oss config.json → ModelConfig: the gpt-oss-20b config's values (the alternating sliding window, YaRN with the
// exact ramp ends, the biased router and experts), the refusals naming their key, and the YaRN table against
// transformers' own (_compute_yarn_parameters, recorded by tools/gen_gptoss_goldens.py).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "layers/rope.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"
#include "models/model.h"

namespace kestrel {
namespace {

using nlohmann::json;

// Hugging Face openai/gpt-oss-20b config.json (docs/model-math.md §12.1) without its quantization_config (the
// MXFP4 safetensors are refused; the GGUF files carry their own metadata), generic keys omitted.
json gpt_oss_20b() {
  json j = json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": true,
    "eos_token_id": 200002, "pad_token_id": 199999, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "vocab_size": 201088,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": false}})");
  json types = json::array();
  for (int l = 0; l < 24; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  return j;
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "config.json"); }

TEST(GptOssConfig, TwentyB) {
  auto c = parse(gpt_oss_20b());
  ASSERT_TRUE(c) << c.error().message();
  const TextConfig& t = c->text;
  EXPECT_EQ(c->arch, Arch::kGptOss);
  EXPECT_EQ(t.num_attention_heads, 64);
  EXPECT_EQ(t.num_key_value_heads, 8);
  EXPECT_EQ(t.head_dim, 64);
  EXPECT_FALSE(t.qk_norm);
  EXPECT_TRUE(t.attention_bias);
  EXPECT_TRUE(t.attn_sinks);
  EXPECT_EQ(t.gqa_rope.theta, 150000.0);
  EXPECT_TRUE(t.gqa_rope.yarn);
  EXPECT_EQ(t.gqa_rope.factor, 32.0);
  EXPECT_EQ(t.gqa_rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(t.gqa_rope.truncate);
  ASSERT_EQ(t.gqa_window.size(), 24u);
  for (size_t l = 0; l < 24; ++l) EXPECT_EQ(t.gqa_window[l], l % 2 == 0 ? 128 : 0) << l;
  EXPECT_EQ(t.num_experts, 32);
  EXPECT_EQ(t.num_experts_per_token, 4);
  EXPECT_EQ(t.moe_intermediate_size, 2880);
  EXPECT_EQ(t.num_shared_experts, 0);
  EXPECT_EQ(t.router_scoring, RouterScoring::kSoftmax);
  EXPECT_TRUE(t.moe_renormalize);
  EXPECT_FALSE(t.router_bias);
  EXPECT_TRUE(t.router_logit_bias);
  EXPECT_TRUE(t.expert_bias);
  EXPECT_EQ(t.hidden_act, Activation::kSwiGluOai);
  EXPECT_EQ(t.swiglu_alpha, 1.702f);
  EXPECT_EQ(t.swiglu_limit, 7.0f);
  EXPECT_EQ(t.eos_token_id, 200002);
  for (size_t l = 0; l < 24; ++l) {
    EXPECT_EQ(t.attn_kind[l], AttnKind::kGqa);
    EXPECT_EQ(t.ffn_kind[l], FfnKind::kMoe);
  }
  // One [k | v] row of 2 · 8 · 64 floats per token in each of the 24 layers.
  const CacheGeometry g = cache_geometry_of(*c);
  EXPECT_EQ(g.mla_layers.size(), 24u);
  EXPECT_EQ(g.mla_row_floats, 1024);
  EXPECT_EQ(g.mla_rope, 0);
}

TEST(GptOssConfig, TransformersDefaults) {
  json j = gpt_oss_20b();
  for (const char* k : {"layer_types", "rope_scaling", "rope_theta", "sliding_window", "swiglu_limit"}) j.erase(k);
  auto c = parse(j);
  ASSERT_TRUE(c) << c.error().message();
  const TextConfig& t = c->text;
  // GptOssConfig: sliding window 128 on the even layers, YaRN factor 32 over 4096, theta 150000, truncate false.
  for (size_t l = 0; l < 24; ++l) EXPECT_EQ(t.gqa_window[l], l % 2 == 0 ? 128 : 0) << l;
  EXPECT_TRUE(t.gqa_rope.yarn);
  EXPECT_EQ(t.gqa_rope.theta, 150000.0);
  EXPECT_EQ(t.gqa_rope.factor, 32.0);
  EXPECT_FALSE(t.gqa_rope.truncate);
  EXPECT_EQ(t.swiglu_limit, 7.0f);
}

TEST(GptOssConfig, RefusalsNameTheKey) {
  auto refused = [](const std::function<void(json&)>& edit) {
    json j = gpt_oss_20b();
    edit(j);
    auto c = parse(j);
    return c ? std::string("accepted") : c.error().message();
  };
  EXPECT_NE(refused([](json& j) { j["quantization_config"] = {{"quant_method", "mxfp4"}}; }).find("'quantization_config'"),
            std::string::npos);
  EXPECT_NE(refused([](json& j) { j["num_key_value_heads"] = 7; }).find("'num_key_value_heads'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["head_dim"] = 63; }).find("'head_dim'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["layer_types"] = {"full_attention"}; }).find("'layer_types'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["layer_types"][3] = "chunked_attention"; }).find("'layer_types'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["num_experts_per_tok"] = 33; }).find("'num_experts_per_tok'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["rope_scaling"]["rope_type"] = "longrope"; }).find("'rope_scaling'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["rope_scaling"]["truncate"] = "no"; }).find("'truncate'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["swiglu_limit"] = -1.0; }).find("'swiglu_limit'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["sliding_window"] = -3; }).find("'sliding_window'"), std::string::npos);
}

// The YaRN table of gpt-oss-20b (head_dim 64) against transformers' _compute_yarn_parameters, with the
// released truncate: false and with truncate: true (the rounding llama.cpp always applies): same fp32 formula,
// so a few ulps at most; the two settings differ by far more on the pairs inside the ramp.
TEST(GptOssConfig, YarnTableMatchesTransformers) {
  auto f = SafetensorsFile::open(std::string(KESTREL_TEST_DATA) + "/models/gptoss_micro.safetensors");
  ASSERT_TRUE(f) << f.error().message();
  auto vec = [&](const std::string& name) {
    for (const auto& e : f->header().entries)
      if (e.name == name) return to_f32(f->view(e));
    ADD_FAILURE() << name << " missing";
    return std::vector<float>{};
  };
  for (bool truncate : {false, true}) {
    const std::string tag = truncate ? "true" : "false";
    const std::vector<float> want = vec("yarn_inv_freq_truncate_" + tag);
    const std::vector<float> factor = vec("yarn_attention_factor_truncate_" + tag);
    json j = gpt_oss_20b();
    j["rope_scaling"]["truncate"] = truncate;
    auto c = parse(j);
    ASSERT_TRUE(c) << c.error().message();
    const MlaRope rope(c->text.gqa_rope, 64);
    ASSERT_EQ(rope.inv_freq().size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(rope.inv_freq()[i], want[i], 4e-7f * want[i]) << "truncate " << tag << " pair " << i;
    ASSERT_EQ(factor.size(), 1u);
    EXPECT_NEAR(rope.magnitude(), factor[0], 1e-6f);
  }
  const std::vector<float> a = vec("yarn_inv_freq_truncate_false"), b = vec("yarn_inv_freq_truncate_true");
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::fabs(static_cast<double>(a[i]) - b[i]) / b[i]);
  EXPECT_GT(most, 1e-2) << "the two rounding rules should differ inside the ramp";
}

}  // namespace
}  // namespace kestrel
