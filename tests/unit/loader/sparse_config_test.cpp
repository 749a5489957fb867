// Optional K3.1-style DSA fields in text_config: sparse_attn_layers (one-based, each a full-attention
// layer), index_n_heads, index_head_dim, index_topk — all or none, range-checked.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loader/model_config.h"

namespace kestrel {
namespace {

using nlohmann::json;

// A minimal kimi_k3 config: 4 layers, MLA at one-based 2 and 4.
json base() {
  json t = {{"model_type", "kimi_linear"}, {"vocab_size", 512}, {"hidden_size", 256}, {"num_hidden_layers", 4},
            {"num_attention_heads", 2}, {"intermediate_size", 512}, {"hidden_act", "silu"}, {"rms_norm_eps", 1e-5},
            {"attn_res_block_size", 2}, {"first_k_dense_replace", 1}, {"num_experts", 4},
            {"num_experts_per_token", 2}, {"num_shared_experts", 1}, {"moe_intermediate_size", 64},
            {"routed_expert_hidden_size", 128}, {"q_lora_rank", 64}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
            {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"mla_use_nope", true},
            {"linear_attn_config", {{"num_heads", 2}, {"head_dim", 128}, {"short_conv_kernel_size", 4},
                                    {"full_attn_layers", {2, 4}}, {"kda_layers", {1, 3}}}}};
  return {{"model_type", "kimi_k3"}, {"text_config", t}};
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "config.json"); }

json with_sparse(json j) {
  j["text_config"]["sparse_attn_layers"] = {4};
  j["text_config"]["index_n_heads"] = 8;
  j["text_config"]["index_head_dim"] = 128;
  j["text_config"]["index_topk"] = 64;
  return j;
}

std::string error_of(const json& j) {
  auto c = parse(j);
  EXPECT_FALSE(c.has_value());
  return c.has_value() ? "" : c.error().message();
}

TEST(SparseAttnConfig, AbsentMeansDense) {
  auto c = parse(base());
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_FALSE(c->text.has_sparse_attn());
  EXPECT_EQ(c->text.index_topk, 0);
}

TEST(SparseAttnConfig, ParsesZeroBased) {
  auto c = parse(with_sparse(base()));
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->text.sparse_attn_layers, std::vector<int>{3});
  EXPECT_EQ(c->text.index_n_heads, 8);
  EXPECT_EQ(c->text.index_head_dim, 128);
  EXPECT_EQ(c->text.index_topk, 64);
}

TEST(SparseAttnConfig, Errors) {
  json j = with_sparse(base());
  j["text_config"].erase("index_topk");
  EXPECT_NE(error_of(j).find("key 'index_topk': missing required key"), std::string::npos);
  j = with_sparse(base());
  j["text_config"]["sparse_attn_layers"] = {3};
  EXPECT_NE(error_of(j).find("layer 3 is not a full-attention layer"), std::string::npos);
  j["text_config"]["sparse_attn_layers"] = {5};
  EXPECT_NE(error_of(j).find("one-based layer numbers in 1..4"), std::string::npos);
  j["text_config"]["sparse_attn_layers"] = {4, 4};
  EXPECT_NE(error_of(j).find("layer 4 listed twice"), std::string::npos);
  j["text_config"]["sparse_attn_layers"] = json::array();
  EXPECT_NE(error_of(j).find("must name at least one layer"), std::string::npos);
  j = with_sparse(base());
  j["text_config"]["index_n_heads"] = 0;
  EXPECT_NE(error_of(j).find("key 'index_n_heads': 0 is outside 1..4096"), std::string::npos);
  j = with_sparse(base());
  j["text_config"]["index_head_dim"] = "128";
  EXPECT_NE(error_of(j).find("key 'index_head_dim': must be an integer"), std::string::npos);
  j = with_sparse(base());
  j["text_config"]["index_topk"] = int64_t{1} << 40;
  EXPECT_NE(error_of(j).find("key 'index_topk': integer out of range"), std::string::npos);
  j = base();
  j["text_config"]["index_topk"] = 2048;  // a lone indexer field is not silently ignored
  EXPECT_NE(error_of(j).find("sparse_attn_layers"), std::string::npos);
}

}  // namespace
}  // namespace kestrel
