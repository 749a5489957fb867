#include "loader/gguf_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace kestrel {
namespace {

using nlohmann::json;

bool any_layer_tensor(const GgufHeader& h, const std::string& suffix) {
  for (const auto& t : h.tensors)
    if (t.name.rfind("blk.", 0) == 0 && t.name.size() > suffix.size() &&
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

// Reads `<arch>.<key>` values, keeping the first error (file and key named).
class Keys {
 public:
  Keys(const GgufHeader& h, std::string arch, std::string label) : h_(h), arch_(std::move(arch)), label_(std::move(label)) {}
  const Status& status() const { return st_; }
  const GgufValue* find(const std::string& key) const { return h_.find(arch_ + "." + key); }
  int64_t req_int(const std::string& key) {
    const GgufValue* v = find(key);
    if (v == nullptr) return fail(key, "missing required key"), 0;
    auto i = v->is_array() ? std::nullopt : v->as_int();
    if (!i) return fail(key, "must be an integer scalar"), 0;
    return *i;
  }
  std::optional<int64_t> opt_int(const std::string& key) { return find(key) ? std::optional(req_int(key)) : std::nullopt; }
  double req_num(const std::string& key) {
    const GgufValue* v = find(key);
    if (v == nullptr) return fail(key, "missing required key"), 0.0;
    auto d = v->is_array() ? std::nullopt : v->as_double();
    if (!d) return fail(key, "must be a number"), 0.0;
    return *d;
  }
  std::optional<double> opt_num(const std::string& key) { return find(key) ? std::optional(req_num(key)) : std::nullopt; }
  void fail(const std::string& key, const std::string& what) {
    if (st_.is_ok()) st_ = invalid_argument(label_ + ": key '" + arch_ + "." + key + "': " + what);
  }

 private:
  const GgufHeader& h_;
  std::string arch_, label_;
  Status st_;
};

std::optional<std::string> opt_string(const GgufHeader& h, const std::string& key) {
  const GgufValue* v = h.find(key);
  return v ? v->as_string() : std::nullopt;
}

void token_ids(const GgufHeader& h, json& t) {
  for (const auto& [hf, key] : {std::pair{"bos_token_id", "tokenizer.ggml.bos_token_id"},
                                std::pair{"eos_token_id", "tokenizer.ggml.eos_token_id"},
                                std::pair{"pad_token_id", "tokenizer.ggml.padding_token_id"}})
    if (const GgufValue* v = h.find(key); v && !v->is_array() && v->as_int()) t[hf] = *v->as_int();
}

// `<arch>.vocab_size`, or (converters that write none) the second dimension of token_embd.weight.
void vocab_size(const GgufHeader& h, Keys& k, json& t) {
  if (auto v = k.opt_int("vocab_size")) {
    t["vocab_size"] = *v;
  } else if (const GgufTensorInfo* e = h.tensor("token_embd.weight"); e && e->ne.size() == 2) {
    t["vocab_size"] = e->ne[1];
  } else {
    k.fail("vocab_size", "missing, and no 2-D token_embd.weight to read it from");
  }
}

// `deepseek2` (DeepSeek V2 / V2-Lite, V3, V3.2 without its indexer, Kimi K2 as conversion/deepseek.py
// writes them) → a deepseek_v3 config.json. Only what that converter writes for these models is accepted:
// MLA with or without q_lora and the k_b/v_b split (key_length_mla present), sigmoid routing with the
// e_score_correction bias (noaux_tc) or softmax routing without it (V2), groups optional, YaRN given as
// factor/original length/betas/log multiplier (the converter stores 0.1·mscale_all_dim; llama.cpp, like
// DeepSeek's V2 and V3 configs, takes mscale = mscale_all_dim).
Result<std::string> deepseek2_config_json(const GgufHeader& h, const std::string& label) {
  Keys k(h, "deepseek2", label);
  json t;
  t["model_type"] = "deepseek_v3";
  t["num_hidden_layers"] = k.req_int("block_count");
  t["hidden_size"] = k.req_int("embedding_length");
  t["num_attention_heads"] = k.req_int("attention.head_count");
  t["intermediate_size"] = k.req_int("feed_forward_length");
  t["rms_norm_eps"] = k.req_num("attention.layer_norm_rms_epsilon");
  vocab_size(h, k, t);
  t["hidden_act"] = "silu";
  t["first_k_dense_replace"] = k.opt_int("leading_dense_block_count").value_or(0);
  t["n_routed_experts"] = k.req_int("expert_count");
  t["num_experts_per_tok"] = k.req_int("expert_used_count");
  t["n_shared_experts"] = k.req_int("expert_shared_count");
  t["moe_intermediate_size"] = k.req_int("expert_feed_forward_length");
  if (const GgufValue* v = k.find("expert_weights_norm")) {
    auto b = v->is_array() ? std::nullopt : v->as_int();
    if (!b) k.fail("expert_weights_norm", "must be a bool");
    t["norm_topk_prob"] = b.value_or(0) != 0;
  } else {
    t["norm_topk_prob"] = false;  // llama.cpp: absent = no renormalization
  }
  t["routed_scaling_factor"] = k.opt_num("expert_weights_scale").value_or(1.0);
  // Routing. llama.cpp reads a missing gating function as softmax (DeepSeek V2 / V2.5 files carry none;
  // the converter writes 1 from a V2 config's scoring_func). Sigmoid (2) comes with the correction bias
  // (noaux_tc); softmax without it, as DeepSeek V2's greedy (one group) or group_limited_greedy (groups).
  const int64_t gating = k.opt_int("expert_gating_func").value_or(1);
  const bool bias = any_layer_tensor(h, ".exp_probs_b.bias");
  const int64_t groups = std::max<int64_t>(1, k.opt_int("expert_group_count").value_or(1));
  t["n_group"] = groups;
  t["topk_group"] = std::max<int64_t>(1, k.opt_int("expert_group_used_count").value_or(1));
  if (gating == 2) {
    if (!bias)
      k.fail("expert_gating_func", "sigmoid routing without blk.*.exp_probs_b.bias (e_score_correction_bias) is not supported");
    t["scoring_func"] = "sigmoid";
    t["topk_method"] = "noaux_tc";
  } else if (gating == 1) {
    if (bias)
      k.fail("expert_gating_func",
             "softmax routing (1, or absent: DeepSeek V2) with blk.*.exp_probs_b.bias is not supported");
    t["scoring_func"] = "softmax";
    // DeepSeek V2 scores a group by its best expert; llama.cpp's build_moe_ffn by its top-2 sum for every
    // gating function. The model's own rule is built (as from safetensors); they differ only with groups.
    t["topk_method"] = groups > 1 ? "group_limited_greedy" : "greedy";
  } else {
    k.fail("expert_gating_func",
           std::to_string(gating) + " is not supported (1 softmax: DeepSeek V2; 2 sigmoid: V3 / Kimi K2)");
  }
  // MLA: q_lora (q_a / q_a_norm / q_b) or, DeepSeek V2-Lite, one attn_q matrix. The converter writes no
  // q_lora_rank for V2-Lite; a 0 (what it writes for a config holding q_lora_rank 0) is the same model.
  const auto q_lora = k.opt_int("attention.q_lora_rank");
  if (q_lora && *q_lora > 0) {
    t["q_lora_rank"] = *q_lora;
  } else if (q_lora && *q_lora < 0) {
    k.fail("attention.q_lora_rank", "must not be negative");
  } else if (h.tensor("blk.0.attn_q.weight") == nullptr) {
    k.fail("attention.q_lora_rank", std::string(q_lora ? "0" : "missing") +
                                        " (no q_lora projection) but no blk.0.attn_q.weight to project the query with");
  }
  t["kv_lora_rank"] = k.req_int("attention.kv_lora_rank");
  const int64_t rope = k.req_int("rope.dimension_count");
  t["qk_rope_head_dim"] = rope;
  if (!k.find("attention.key_length_mla"))
    k.fail("attention.key_length_mla", "missing: files from converters before the k_b/v_b split are not supported");
  t["qk_nope_head_dim"] = k.req_int("attention.key_length_mla") - rope;
  t["v_head_dim"] = k.req_int("attention.value_length_mla");
  t["rope_theta"] = k.opt_num("rope.freq_base").value_or(10000.0);
  const auto scaling = opt_string(h, "deepseek2.rope.scaling.type");
  if (scaling && *scaling == "yarn") {
    if (auto a = k.opt_num("rope.scaling.yarn_attn_factor"); a && *a != 1.0)
      k.fail("rope.scaling.yarn_attn_factor", "only 1 is supported");
    if (auto e = k.opt_num("rope.scaling.yarn_ext_factor"); e && *e != 1.0)
      k.fail("rope.scaling.yarn_ext_factor", "only 1 is supported");
    // In float, as llama.cpp undoes the converter's 0.1 (0.1f / 0.1f is exactly 1).
    const double mscale = static_cast<float>(k.req_num("rope.scaling.yarn_log_multiplier")) / 0.1f;
    t["rope_scaling"] = {{"type", "yarn"},
                         {"factor", k.req_num("rope.scaling.factor")},
                         {"original_max_position_embeddings", k.req_int("rope.scaling.original_context_length")},
                         {"beta_fast", k.opt_num("rope.scaling.yarn_beta_fast").value_or(32.0)},
                         {"beta_slow", k.opt_num("rope.scaling.yarn_beta_slow").value_or(1.0)},
                         {"mscale", mscale},
                         {"mscale_all_dim", mscale}};
  } else if (scaling && *scaling != "none") {
    k.fail("rope.scaling.type", "'" + *scaling + "' is not supported (none, yarn)");
  }
  t["tie_word_embeddings"] = h.tensor("output.weight") == nullptr;
  token_ids(h, t);
  if (!k.status().is_ok()) return k.status();
  return t.dump();
}

// The grouped-query attention keys qwen3moe and gpt-oss share: query and key/value heads and their width (the
// value width and the RoPE dimensions must equal it).
void gqa_head_keys(Keys& k, json& t) {
  t["num_attention_heads"] = k.req_int("attention.head_count");
  t["num_key_value_heads"] = k.req_int("attention.head_count_kv");
  const int64_t hd = k.req_int("attention.key_length");
  if (auto v = k.opt_int("attention.value_length"); v && *v != hd)
    k.fail("attention.value_length", "must equal attention.key_length");
  if (auto r = k.opt_int("rope.dimension_count"); r && *r != hd)
    k.fail("rope.dimension_count", "partial RoPE is not supported (must equal attention.key_length)");
  t["head_dim"] = hd;
}

// `qwen3moe` (Qwen3-MoE as conversion/qwen.py's Qwen3MoeModel writes it) → a qwen3_moe config.json. llama.cpp
// runs every layer as MoE with softmax routing and always renormalises the chosen weights (its graph passes
// norm_w = true whatever the checkpoint's norm_topk_prob), so the config says the same.
Result<std::string> qwen3moe_config_json(const GgufHeader& h, const std::string& label) {
  Keys k(h, "qwen3moe", label);
  json t;
  t["model_type"] = "qwen3_moe";
  t["num_hidden_layers"] = k.req_int("block_count");
  t["hidden_size"] = k.req_int("embedding_length");
  gqa_head_keys(k, t);
  t["intermediate_size"] = k.opt_int("feed_forward_length").value_or(0);
  t["rms_norm_eps"] = k.req_num("attention.layer_norm_rms_epsilon");
  vocab_size(h, k, t);
  t["hidden_act"] = "silu";
  t["num_experts"] = k.req_int("expert_count");
  t["num_experts_per_tok"] = k.req_int("expert_used_count");
  t["moe_intermediate_size"] = k.req_int("expert_feed_forward_length");
  t["norm_topk_prob"] = true;
  if (auto w = k.opt_num("expert_weights_scale"); w && *w != 0.0 && *w != 1.0)
    k.fail("expert_weights_scale", "only 1 is supported");
  t["rope_theta"] = k.opt_num("rope.freq_base").value_or(10000.0);
  if (const auto scaling = opt_string(h, "qwen3moe.rope.scaling.type"); scaling && *scaling != "none")
    k.fail("rope.scaling.type", "'" + *scaling + "' is not supported (none)");
  t["tie_word_embeddings"] = h.tensor("output.weight") == nullptr;
  token_ids(h, t);
  if (!k.status().is_ok()) return k.status();
  return t.dump();
}

// `gpt-oss` (gpt-oss as conversion/gpt_oss.py writes it) → a gpt_oss config.json, read as llama.cpp's
// openai-moe graph reads the file: sliding window on the layers of pattern 2 (even layers) unless the file lists
// them, the clamped SwiGLU with llama.cpp's constants (alpha 1.702, limit 7), YaRN with the ramp ends rounded out
// to whole pairs (llama.cpp always rounds; the released config.json says "truncate": false, so the same weights from
// safetensors and from GGUF rotate a few pair frequencies differently), attention factor 1 + 0.1 ln(factor).
Result<std::string> gptoss_config_json(const GgufHeader& h, const std::string& label) {
  Keys k(h, "gpt-oss", label);
  json t;
  t["model_type"] = "gpt_oss";
  const int64_t layers = k.req_int("block_count");
  t["num_hidden_layers"] = layers;
  t["hidden_size"] = k.req_int("embedding_length");
  gqa_head_keys(k, t);
  t["intermediate_size"] = k.req_int("expert_feed_forward_length");
  t["rms_norm_eps"] = k.req_num("attention.layer_norm_rms_epsilon");
  vocab_size(h, k, t);
  t["num_local_experts"] = k.req_int("expert_count");
  t["num_experts_per_tok"] = k.req_int("expert_used_count");
  if (auto w = k.opt_num("expert_weights_scale"); w && *w != 0.0 && *w != 1.0)
    k.fail("expert_weights_scale", "only 1 is supported");
  const int64_t window = k.req_int("attention.sliding_window");
  t["sliding_window"] = window;
  json types = json::array();
  const GgufValue* pat = k.find("attention.sliding_window_pattern");
  for (int64_t l = 0; l < layers; ++l) {
    bool swa = l % 2 == 0;  // llama.cpp's pattern 2: il % 2 < 1
    if (pat != nullptr && pat->is_array()) {
      auto b = static_cast<int64_t>(pat->size()) == layers ? pat->as_int(static_cast<size_t>(l)) : std::nullopt;
      if (!b) k.fail("attention.sliding_window_pattern", "needs one bool per layer");
      swa = b.value_or(0) != 0;
    } else if (pat != nullptr) {
      const auto n = pat->as_int();
      if (!n || *n < 1) k.fail("attention.sliding_window_pattern", "must be a positive integer or a per-layer array");
      swa = n && *n >= 1 && l % *n < *n - 1;
    }
    types.push_back(swa ? "sliding_attention" : "full_attention");
  }
  t["layer_types"] = types;
  t["rope_theta"] = k.opt_num("rope.freq_base").value_or(10000.0);
  if (k.find("rope.freq_base_swa") && k.req_num("rope.freq_base_swa") != t["rope_theta"].get<double>())
    k.fail("rope.freq_base_swa", "a different RoPE base on the sliding layers is not supported");
  const auto scaling = opt_string(h, "gpt-oss.rope.scaling.type");
  if (scaling && *scaling == "yarn") {
    for (const char* key : {"rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor"})
      if (auto a = k.opt_num(key); a && *a != 1.0) k.fail(key, "only 1 is supported");
    t["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", k.req_num("rope.scaling.factor")},
                         {"original_max_position_embeddings", k.req_int("rope.scaling.original_context_length")},
                         {"beta_fast", k.opt_num("rope.scaling.yarn_beta_fast").value_or(32.0)},
                         {"beta_slow", k.opt_num("rope.scaling.yarn_beta_slow").value_or(1.0)},
                         {"truncate", true}};
  } else if (scaling && *scaling != "none") {
    k.fail("rope.scaling.type", "'" + *scaling + "' is not supported (none, yarn)");
  } else {
    t["rope_scaling"] = {{"rope_type", "default"}};
  }
  t["attention_bias"] = any_layer_tensor(h, ".attn_q.bias");
  t["swiglu_alpha"] = 1.702;
  t["swiglu_limit"] = 7.0;
  t["tie_word_embeddings"] = h.tensor("output.weight") == nullptr;
  token_ids(h, t);
  if (!k.status().is_ok()) return k.status();
  return t.dump();
}

}  // namespace

Result<std::string> gguf_to_hf_config_json(const GgufHeader& h, const std::string& label) {
  const GgufValue* archv = h.find("general.architecture");
  const auto arch = archv ? archv->as_string() : std::nullopt;
  if (!arch) return invalid_argument(label + ": key 'general.architecture': missing or not a string");
  if (*arch == "deepseek2") return deepseek2_config_json(h, label);
  if (*arch == "qwen3moe") return qwen3moe_config_json(h, label);
  if (*arch == "gpt-oss") return gptoss_config_json(h, label);
  if (*arch != "kimi-k3" && *arch != "kimi-linear")
    return unsupported(label + ": GGUF architecture '" + *arch +
                       "' is not supported (kimi-k3, kimi-linear, deepseek2, qwen3moe, gpt-oss are)");
  const bool k3 = *arch == "kimi-k3";
  Keys k(h, *arch, label);
  json t;
  t["model_type"] = "kimi_linear";
  const int64_t layers = k.req_int("block_count");
  t["num_hidden_layers"] = layers;
  t["hidden_size"] = k.req_int("embedding_length");
  t["num_attention_heads"] = k.req_int("attention.head_count");
  t["intermediate_size"] = k.req_int("feed_forward_length");
  t["rms_norm_eps"] = k.req_num("attention.layer_norm_rms_epsilon");
  vocab_size(h, k, t);
  if (k3) {
    t["hidden_act"] = "situ";
    t["activation_situ_beta"] = k.req_num("activation.situ_beta");
    t["activation_situ_linear_beta"] = k.req_num("activation.situ_linear_beta");
    t["attn_res_block_size"] = k.req_int("attn_res.block_size");
  } else {
    t["hidden_act"] = "silu";
  }
  t["first_k_dense_replace"] = k.req_int("leading_dense_block_count");
  t["num_experts"] = k.req_int("expert_count");
  t["num_experts_per_token"] = k.req_int("expert_used_count");
  t["num_shared_experts"] = k.req_int("expert_shared_count");
  t["moe_intermediate_size"] = k.req_int("expert_feed_forward_length");
  if (auto v = k.opt_int("expert_latent_length")) t["routed_expert_hidden_size"] = *v;
  t["latent_moe_use_norm"] = any_layer_tensor(h, ".ffn_routed_norm.weight");
  if (const GgufValue* v = k.find("expert_weights_norm")) {
    auto b = v->is_array() ? std::nullopt : v->as_int();
    if (!b) k.fail("expert_weights_norm", "must be a bool");
    t["moe_renormalize"] = b.value_or(0) != 0;
  }
  if (auto v = k.opt_num("expert_weights_scale")) t["routed_scaling_factor"] = *v;
  if (auto v = k.opt_int("expert_gating_func"); v && *v != 2)  // 2 = LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    k.fail("expert_gating_func", "only sigmoid routing (2) is supported");
  t["num_expert_group"] = k.opt_int("expert_group_count").value_or(1);
  t["topk_group"] = k.opt_int("expert_group_used_count").value_or(1);
  if (auto v = k.opt_int("attention.q_lora_rank")) t["q_lora_rank"] = *v;
  t["kv_lora_rank"] = k.req_int("attention.kv_lora_rank");
  const int64_t rope = k.req_int("rope.dimension_count");
  t["qk_rope_head_dim"] = rope;
  t["qk_nope_head_dim"] = k.req_int("attention.key_length_mla") - rope;
  t["v_head_dim"] = k.req_int("attention.value_length_mla");
  t["mla_use_nope"] = true;  // llama.cpp's kimi-k3 / kimi-linear graphs never rotate (NoPE MLA)
  t["mla_use_output_gate"] = any_layer_tensor(h, ".attn_gate.weight");
  t["tie_word_embeddings"] = h.tensor("output.weight") == nullptr;
  token_ids(h, t);

  json la;
  la["num_heads"] = k.req_int("attention.head_count");
  la["head_dim"] = k.req_int("kda.head_dim");
  la["short_conv_kernel_size"] = k.req_int("ssm.conv_kernel");
  la["use_full_rank_gate"] = any_layer_tensor(h, ".ssm_g.weight");
  if (auto v = k.opt_num("kda.gate_lower_bound")) la["gate_lower_bound"] = *v;
  json kda = json::array(), full = json::array();
  if (const GgufValue* kv = k.find("attention.head_count_kv"); kv && kv->is_array()) {
    if (static_cast<int64_t>(kv->size()) != layers) k.fail("attention.head_count_kv", "needs one entry per layer");
    for (size_t l = 0; l < kv->size(); ++l) {
      auto n = kv->as_int(l);
      if (!n) {
        k.fail("attention.head_count_kv", "entries must be integers");
        break;
      }
      (*n == 0 ? kda : full).push_back(static_cast<int64_t>(l) + 1);  // one-based, as in config.json
    }
  } else {
    k.fail("attention.head_count_kv", "missing, or not a per-layer array (it marks KDA layers with 0)");
  }
  la["kda_layers"] = kda;
  la["full_attn_layers"] = full;
  t["linear_attn_config"] = la;
  if (!k.status().is_ok()) return k.status();
  json top = k3 ? json{{"model_type", "kimi_k3"}, {"text_config", t}} : t;
  return top.dump();
}

Result<ModelConfig> model_config_from_gguf(const GgufHeader& h, const std::string& label) {
  auto text = gguf_to_hf_config_json(h, label);
  if (!text) return text.error();
  auto c = parse_model_config(*text, label + " (metadata)");
  if (!c) return c.error();
  const GgufTensorInfo* e = h.tensor("blk." + std::to_string(c->text.num_hidden_layers - 1) + ".ffn_gate_exps.weight");
  c->text.experts_mxfp4 = c->arch != Arch::kDeepseekV3 && c->arch != Arch::kQwen3Moe && c->arch != Arch::kGptOss && e != nullptr && e->type == GgmlType::kMXFP4;
  return c;
}

}  // namespace kestrel
