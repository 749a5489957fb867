#include "loader/qwen3_config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "loader/json_reader.h"

namespace kestrel {

using config_detail::check_bounds;
using config_detail::kBigSize;
using config_detail::Reader;
using nlohmann::json;

Status parse_qwen3_moe_config(const json& j, const std::string& label, ModelConfig& c) {
  c.weight_prefix = "";
  c.lm_head_name = "lm_head.weight";
  TextConfig& t = c.text;
  Reader r(j, label);
  t.vocab_size = r.req_int("vocab_size");
  t.hidden_size = r.req_int("hidden_size");
  t.num_hidden_layers = r.req_int("num_hidden_layers");
  t.num_attention_heads = r.req_int("num_attention_heads");
  t.num_key_value_heads = r.opt_int("num_key_value_heads", t.num_attention_heads);
  // transformers: head_dim defaults to hidden_size / num_attention_heads.
  t.head_dim = r.opt_int("head_dim", t.num_attention_heads > 0 ? t.hidden_size / t.num_attention_heads : 0);
  t.intermediate_size = r.opt_int("intermediate_size", 0);
  const std::string act = r.has("hidden_act") ? r.req_str("hidden_act") : "silu";
  t.rms_norm_eps = r.opt_float("rms_norm_eps", 1e-6f);
  t.gqa_rope.theta = r.has("rope_theta") ? static_cast<double>(r.req_float("rope_theta")) : 10000.0;
  t.num_experts = r.opt_int("num_experts", 0);
  t.num_experts_per_token = r.opt_int("num_experts_per_tok", 0);
  t.moe_intermediate_size = r.opt_int("moe_intermediate_size", 0);
  t.moe_renormalize = r.opt_bool("norm_topk_prob", false);
  const int sparse_step = r.opt_int("decoder_sparse_step", 1);
  const bool attention_bias = r.opt_bool("attention_bias", false);
  const bool sliding = r.opt_bool("use_sliding_window", false);
  t.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  t.bos_token_id = r.has("bos_token_id") && j["bos_token_id"].is_number_integer() ? r.req_int("bos_token_id") : -1;
  t.eos_token_id = r.has("eos_token_id") && j["eos_token_id"].is_number_integer() ? r.req_int("eos_token_id") : -1;
  std::vector<int> mlp_only;
  if (r.has("mlp_only_layers")) {
    const json& v = j["mlp_only_layers"];
    if (!v.is_array()) return invalid_argument(label + ": key 'mlp_only_layers': must be a list of layer indices");
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= t.num_hidden_layers)
        return invalid_argument(label + ": key 'mlp_only_layers': entries must be zero-based layer indices");
      mlp_only.push_back(e.get<int>());
    }
  }
  if (r.has("rope_scaling")) {
    const json& s = j["rope_scaling"];
    const std::string type = s.is_object() && s.contains("rope_type") && s["rope_type"].is_string()
                                 ? s["rope_type"].get<std::string>()
                                 : (s.is_object() && s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "");
    if (type != "default")
      return unsupported(label + ": key 'rope_scaling': only null or the default rope is supported (no YaRN for "
                                 "Qwen3-MoE yet)");
  }
  if (!r.status().is_ok()) return r.status();
  if (act != "silu") return unsupported(label + ": key 'hidden_act': unsupported activation '" + act + "' (silu)");
  if (attention_bias) return unsupported(label + ": key 'attention_bias': q/k/v/o biases are not supported");
  if (sliding) return unsupported(label + ": key 'use_sliding_window': sliding-window attention is not supported");

  KESTREL_RETURN_IF_ERROR(check_bounds(label, {
           {"vocab_size", t.vocab_size, 1, kBigSize}, {"hidden_size", t.hidden_size, 1, kBigSize},
           {"num_hidden_layers", t.num_hidden_layers, 1, 4096}, {"num_attention_heads", t.num_attention_heads, 1, 4096},
           {"num_key_value_heads", t.num_key_value_heads, 1, 4096}, {"head_dim", t.head_dim, 2, 4096},
           {"intermediate_size", t.intermediate_size, 0, kBigSize}, {"num_experts", t.num_experts, 0, 1 << 16},
           {"moe_intermediate_size", t.moe_intermediate_size, 0, kBigSize}, {"decoder_sparse_step", sparse_step, 1, 4096}}));
  if (t.num_attention_heads % t.num_key_value_heads != 0)
    return invalid_argument(label + ": key 'num_key_value_heads': must divide num_attention_heads");
  if (t.head_dim % 2 != 0) return invalid_argument(label + ": key 'head_dim': must be even (RoPE rotates halves)");
  if (!(t.rms_norm_eps > 0.0f) || !(t.rms_norm_eps < 1.0f))
    return invalid_argument(label + ": key 'rms_norm_eps': must be in (0, 1)");
  if (!(t.gqa_rope.theta > 1.0) || !std::isfinite(t.gqa_rope.theta))
    return invalid_argument(label + ": key 'rope_theta': must be > 1");
  if (t.num_experts > 0) {
    if (t.num_experts_per_token < 1 || t.num_experts_per_token > t.num_experts)
      return invalid_argument(label + ": key 'num_experts_per_tok': must be in 1..num_experts");
    if (t.moe_intermediate_size < 1) return invalid_argument(label + ": key 'moe_intermediate_size': missing or zero");
  }
  // Softmax routing over every expert, no groups, no correction bias, no shared experts (docs/model-math.md §11).
  t.router_scoring = RouterScoring::kSoftmax;
  t.router_bias = false;
  t.num_expert_group = t.topk_group = 1;
  t.num_shared_experts = 0;
  t.routed_scaling_factor = 1.0f;
  t.qk_norm = true;
  t.hidden_act = Activation::kSiLU;
  t.first_k_dense_replace = 0;
  t.attn_kind.assign(static_cast<size_t>(t.num_hidden_layers), AttnKind::kGqa);
  t.ffn_kind.assign(static_cast<size_t>(t.num_hidden_layers), FfnKind::kDense);
  // transformers' Qwen3MoeDecoderLayer: sparse when not in mlp_only_layers, experts exist and (l + 1) % step == 0.
  for (int l = 0; l < t.num_hidden_layers; ++l)
    if (t.num_experts > 0 && (l + 1) % sparse_step == 0 && std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end())
      t.ffn_kind[static_cast<size_t>(l)] = FfnKind::kMoe;
  for (int l = 0; l < t.num_hidden_layers; ++l)
    if (t.ffn_kind[static_cast<size_t>(l)] == FfnKind::kDense && t.intermediate_size < 1)
      return invalid_argument(label + ": key 'intermediate_size': layer " + std::to_string(l) +
                              " has a dense MLP but the size is missing or zero");
  return Status::ok();
}

}  // namespace kestrel
