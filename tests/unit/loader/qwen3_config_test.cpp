// Qwen3-MoE config.json → ModelConfig: the Qwen3-30B-A3B config's values, the layer kinds transformers derives
// (decoder_sparse_step, mlp_only_layers), the cache row, and every refusal naming its key.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loader/model_config.h"
#include "models/model.h"

namespace kestrel {
namespace {

using nlohmann::json;

// Hugging Face Qwen/Qwen3-30B-A3B config.json (docs/model-math.md §11.1), generic keys omitted.
json qwen3_30b_a3b() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
    "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 151936})");
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "config.json"); }

TEST(Qwen3Config, ThirtyBA3B) {
  auto c = parse(qwen3_30b_a3b());
  ASSERT_TRUE(c) << c.error().message();
  const TextConfig& t = c->text;
  EXPECT_EQ(c->arch, Arch::kQwen3Moe);
  EXPECT_EQ(t.num_attention_heads, 32);
  EXPECT_EQ(t.num_key_value_heads, 4);
  EXPECT_EQ(t.head_dim, 128);
  EXPECT_EQ(t.gqa_rope.theta, 1e6);
  EXPECT_TRUE(t.qk_norm);
  EXPECT_EQ(t.num_experts, 128);
  EXPECT_EQ(t.num_experts_per_token, 8);
  EXPECT_EQ(t.num_shared_experts, 0);
  EXPECT_TRUE(t.moe_renormalize);
  EXPECT_EQ(t.router_scoring, RouterScoring::kSoftmax);
  EXPECT_FALSE(t.router_bias);
  EXPECT_EQ(t.eos_token_id, 151645);
  ASSERT_EQ(t.attn_kind.size(), 48u);
  for (size_t l = 0; l < 48; ++l) {
    EXPECT_EQ(t.attn_kind[l], AttnKind::kGqa);
    EXPECT_EQ(t.ffn_kind[l], FfnKind::kMoe);
  }
  // One [k | v] row of 2 · 4 · 128 floats per token in each of the 48 layers, no positional part.
  const CacheGeometry g = cache_geometry_of(*c);
  EXPECT_EQ(g.mla_layers.size(), 48u);
  EXPECT_EQ(g.mla_row_floats, 1024);
  EXPECT_EQ(g.mla_rope, 0);
  EXPECT_TRUE(g.kda_layers.empty());
  EXPECT_EQ(g.mla_bytes_per_token(), 48 * 1024 * 4);
}

TEST(Qwen3Config, DenseLayersAsTransformersDerivesThem) {
  json j = qwen3_30b_a3b();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto c = parse(j);
  ASSERT_TRUE(c) << c.error().message();
  // MoE where (l + 1) % 2 == 0 and l not in mlp_only_layers: layers 1 and 5.
  const std::vector<FfnKind> want = {FfnKind::kDense, FfnKind::kMoe, FfnKind::kDense,
                                     FfnKind::kDense, FfnKind::kDense, FfnKind::kMoe};
  EXPECT_EQ(c->text.ffn_kind, want);
  j.erase("head_dim");  // transformers' default: hidden_size / num_attention_heads
  auto d = parse(j);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->text.head_dim, 64);
}

TEST(Qwen3Config, RefusalsNameTheKey) {
  auto refused = [](const std::function<void(json&)>& edit) {
    json j = qwen3_30b_a3b();
    edit(j);
    auto c = parse(j);
    return c ? std::string("accepted") : c.error().message();
  };
  EXPECT_NE(refused([](json& j) { j["num_key_value_heads"] = 5; }).find("'num_key_value_heads'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["head_dim"] = 127; }).find("'head_dim'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["use_sliding_window"] = true; }).find("'use_sliding_window'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["attention_bias"] = true; }).find("'attention_bias'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }).find("'rope_scaling'"),
            std::string::npos);
  EXPECT_NE(refused([](json& j) { j["hidden_act"] = "gelu"; }).find("'hidden_act'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["num_experts_per_tok"] = 129; }).find("'num_experts_per_tok'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["mlp_only_layers"] = {48}; }).find("'mlp_only_layers'"), std::string::npos);
  EXPECT_NE(refused([](json& j) { j["mlp_only_layers"] = {0}, j["intermediate_size"] = 0; }).find("'intermediate_size'"),
            std::string::npos);
  EXPECT_NE(refused([](json& j) { j["rope_theta"] = 0.5; }).find("'rope_theta'"), std::string::npos);
  EXPECT_EQ(refused([](json& j) { j["rope_scaling"] = {{"rope_type", "default"}}; }), "accepted");
}

}  // namespace
}  // namespace kestrel
