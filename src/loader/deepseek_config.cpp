#include "loader/deepseek_config.h"

#include <cmath>
#include <initializer_list>

#include "loader/json_reader.h"

namespace kestrel {
namespace {

using config_detail::check_bounds;
using config_detail::kBigSize;
using config_detail::Reader;
using nlohmann::json;

// `eos_token_id` may be an int or a list of ints (first is kept).
int token_id(const json& j, const char* key, Reader& r) {
  if (!r.has(key)) return -1;
  const json& v = j[key];
  if (v.is_array()) {
    if (v.empty() || !v[0].is_number_integer()) return r.fail(key, "must be an integer or a list of integers"), -1;
    return v[0].get<int>();
  }
  return r.req_int(key);
}

Status parse_fp8(const json& j, const std::string& label, TextConfig& t) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return Status::ok();
  const json& q = j["quantization_config"];
  if (!q.is_object()) return invalid_argument(label + ": key 'quantization_config': must be an object");
  Reader r(q, label + " quantization_config");
  const std::string method = r.req_str("quant_method");
  if (!r.status().is_ok()) return r.status();
  if (method != "fp8")
    return unsupported(label + ": quantization_config.quant_method '" + method +
                       "' is not supported for " + "DeepSeek-family checkpoints (fp8 block weights only)");
  if (r.has("fmt") && r.req_str("fmt") != "e4m3") r.fail("fmt", "only 'e4m3' is supported");
  if (r.has("activation_scheme") && r.req_str("activation_scheme") != "dynamic")
    r.fail("activation_scheme", "only 'dynamic' is supported");
  if (!r.has("weight_block_size")) r.fail("weight_block_size", "missing required key");
  if (!r.status().is_ok()) return r.status();
  const json& b = q["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() != 128 || b[1].get<int64_t>() != 128)
    return unsupported(label + ": quantization_config key 'weight_block_size': only [128, 128] is supported");
  t.weights_fp8_block = true;
  return Status::ok();
}

}  // namespace

Status parse_rope_config(const json& j, const std::string& label, MlaRopeConfig& rope) {
  Reader top(j, label);
  const char* key = top.has("rope_scaling") ? "rope_scaling" : top.has("rope_parameters") ? "rope_parameters" : nullptr;
  rope.theta = top.opt_float("rope_theta", 10000.0f);
  if (top.has("rope_theta") && j["rope_theta"].is_number()) rope.theta = j["rope_theta"].get<double>();
  if (!top.status().is_ok()) return top.status();
  if (key == nullptr) return Status::ok();
  const json& rs = j[key];
  if (!rs.is_object()) return invalid_argument(label + ": key '" + key + "': must be an object");
  Reader r(rs, label + " " + key);
  const std::string type = r.has("type") ? r.req_str("type") : r.has("rope_type") ? r.req_str("rope_type") : "default";
  if (r.has("rope_theta") && rs["rope_theta"].is_number()) rope.theta = rs["rope_theta"].get<double>();
  if (!r.status().is_ok()) return r.status();
  if (type == "default") return Status::ok();
  if (type != "yarn" && type != "deepseek_yarn")
    return unsupported(label + ": key '" + key + "': rope type '" + type + "' is not supported (default, yarn)");
  rope.yarn = true;
  auto num = [&](const char* k, double dflt) {
    if (!r.has(k)) return dflt;
    if (!rs[k].is_number()) return r.fail(k, "must be a number"), dflt;
    return rs[k].get<double>();
  };
  rope.factor = num("factor", 0.0);
  rope.beta_fast = num("beta_fast", 32.0);
  rope.beta_slow = num("beta_slow", 1.0);
  rope.mscale = num("mscale", 1.0);
  rope.mscale_all_dim = num("mscale_all_dim", 0.0);
  rope.original_max_position_embeddings = r.req_int("original_max_position_embeddings");
  if (r.has("truncate")) {
    if (!rs["truncate"].is_boolean()) r.fail("truncate", "must be a bool");
    else rope.truncate = rs["truncate"].get<bool>();
  }
  if (!r.has("factor")) r.fail("factor", "missing required key");
  if (!r.status().is_ok()) return r.status();
  if (!(rope.factor >= 1.0 && rope.factor <= 1e6) || !(rope.beta_fast > 0) || !(rope.beta_slow > 0) ||
      rope.beta_fast < rope.beta_slow || rope.original_max_position_embeddings < 1 || !std::isfinite(rope.mscale) ||
      !std::isfinite(rope.mscale_all_dim))
    return invalid_argument(label + ": key '" + key + "': yarn needs factor in [1, 1e6], beta_fast ≥ beta_slow > 0, " +
                            "original_max_position_embeddings ≥ 1");
  return Status::ok();
}

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

Status parse_deepseek_config(const json& j, const std::string& label, ModelConfig& c) {
  c.weight_prefix = "";
  c.lm_head_name = "lm_head.weight";
  TextConfig& t = c.text;
  Reader r(j, label);
  t.vocab_size = r.req_int("vocab_size");
  t.hidden_size = r.req_int("hidden_size");
  t.num_hidden_layers = r.req_int("num_hidden_layers");
  t.num_attention_heads = r.req_int("num_attention_heads");
  t.intermediate_size = r.req_int("intermediate_size");
  const std::string act = r.has("hidden_act") ? r.req_str("hidden_act") : "silu";
  t.rms_norm_eps = r.req_float("rms_norm_eps");
  t.q_lora_rank = r.opt_int("q_lora_rank", 0);  // null → plain q_proj (V2-Lite-like)
  t.kv_lora_rank = r.req_int("kv_lora_rank");
  t.qk_nope_head_dim = r.req_int("qk_nope_head_dim");
  t.qk_rope_head_dim = r.req_int("qk_rope_head_dim");
  t.v_head_dim = r.req_int("v_head_dim");
  t.num_experts = r.opt_int("n_routed_experts", 0);
  t.num_experts_per_token = r.opt_int("num_experts_per_tok", 0);
  t.num_shared_experts = r.opt_int("n_shared_experts", 0);
  t.moe_intermediate_size = r.opt_int("moe_intermediate_size", 0);
  t.first_k_dense_replace = r.opt_int("first_k_dense_replace", 0);
  t.moe_layer_freq = r.opt_int("moe_layer_freq", 1);
  t.num_expert_group = r.opt_int("n_group", 1);
  t.topk_group = r.opt_int("topk_group", 1);
  t.routed_scaling_factor = r.opt_float("routed_scaling_factor", 1.0f);
  const std::string scoring = r.has("scoring_func") ? r.req_str("scoring_func") : "sigmoid";
  const std::string topk_method = r.has("topk_method") ? r.req_str("topk_method") : "noaux_tc";
  t.moe_renormalize = r.opt_bool("norm_topk_prob", true);
  const bool attention_bias = r.opt_bool("attention_bias", false);
  const bool interleave = r.opt_bool("rope_interleave", true);
  t.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  t.bos_token_id = token_id(j, "bos_token_id", r);
  t.eos_token_id = token_id(j, "eos_token_id", r);
  t.pad_token_id = token_id(j, "pad_token_id", r);
  t.num_nextn_predict_layers = r.opt_int("num_nextn_predict_layers", 0);
  if (c.arch == Arch::kDeepseekV32) {
    t.index_n_heads = r.req_int("index_n_heads");
    t.index_head_dim = r.req_int("index_head_dim");
    t.index_topk = r.req_int("index_topk");
  }
  if (!r.status().is_ok()) return r.status();
  if (act != "silu") return unsupported(label + ": key 'hidden_act': unsupported activation '" + act + "' (silu)");
  if (attention_bias) return unsupported(label + ": key 'attention_bias': MLA projection biases are not supported");
  if (!interleave)
    return unsupported(label + ": key 'rope_interleave': only DeepSeek's interleaved rope layout (true) is supported");

  KESTREL_RETURN_IF_ERROR(check_bounds(label, {
           {"vocab_size", t.vocab_size, 1, kBigSize}, {"hidden_size", t.hidden_size, 1, kBigSize},
           {"num_hidden_layers", t.num_hidden_layers, 1, 4096}, {"num_attention_heads", t.num_attention_heads, 1, 4096},
           {"intermediate_size", t.intermediate_size, 1, kBigSize}, {"q_lora_rank", t.q_lora_rank, 0, kBigSize},
           {"kv_lora_rank", t.kv_lora_rank, 1, kBigSize}, {"qk_nope_head_dim", t.qk_nope_head_dim, 0, 1 << 16},
           {"qk_rope_head_dim", t.qk_rope_head_dim, 2, 1 << 16}, {"v_head_dim", t.v_head_dim, 1, 1 << 16},
           {"n_routed_experts", t.num_experts, 0, 1 << 16}, {"n_shared_experts", t.num_shared_experts, 0, 1024},
           {"moe_intermediate_size", t.moe_intermediate_size, 0, kBigSize},
           {"first_k_dense_replace", t.first_k_dense_replace, 0, 4096}, {"moe_layer_freq", t.moe_layer_freq, 1, 4096},
           {"n_group", t.num_expert_group, 1, 1 << 16}, {"topk_group", t.topk_group, 1, 1 << 16},
           {"num_nextn_predict_layers", t.num_nextn_predict_layers, 0, 64}}));
  if (!(t.rms_norm_eps > 0.0f) || !(t.rms_norm_eps < 1.0f))
    return invalid_argument(label + ": key 'rms_norm_eps': must be in (0, 1)");
  if (t.qk_rope_head_dim % 2 != 0)
    return invalid_argument(label + ": key 'qk_rope_head_dim': must be even (rotated in pairs)");
  if (t.num_experts > 0) {
    if (t.num_experts_per_token < 1 || t.num_experts_per_token > t.num_experts)
      return invalid_argument(label + ": key 'num_experts_per_tok': must be in 1..n_routed_experts");
    if (t.moe_intermediate_size < 1) return invalid_argument(label + ": key 'moe_intermediate_size': missing or zero");
    if (t.num_experts % t.num_expert_group != 0)
      return invalid_argument(label + ": key 'n_group': must divide n_routed_experts");
    if (t.topk_group > t.num_expert_group)
      return invalid_argument(label + ": key 'topk_group': must be at most n_group");
    if (t.num_experts_per_token > t.topk_group * (t.num_experts / t.num_expert_group))
      return invalid_argument(label + ": key 'num_experts_per_tok': more than the experts in topk_group groups");
  }
  // Routing variants (docs/model-math.md §7): noaux_tc = sigmoid + correction bias, group score =
  // top-2 sum; greedy / group_limited_greedy = softmax (V2), group score = max, no bias.
  if (scoring == "sigmoid") t.router_scoring = RouterScoring::kSigmoid;
  else if (scoring == "softmax") t.router_scoring = RouterScoring::kSoftmax;
  else return unsupported(label + ": key 'scoring_func': '" + scoring + "' is not supported (sigmoid, softmax)");
  if (topk_method == "noaux_tc") {
    t.router_bias = true;
    if (t.num_expert_group > 1 && t.num_experts / t.num_expert_group < 2)
      return invalid_argument(label + ": key 'n_group': noaux_tc needs at least 2 experts per group (top-2 group score)");
  } else if (topk_method == "greedy") {
    t.router_bias = false;
    if (t.num_expert_group != 1 || t.topk_group != 1)
      return invalid_argument(label + ": key 'topk_method': 'greedy' routing takes no groups (n_group 1)");
  } else if (topk_method == "group_limited_greedy") {
    t.router_bias = false;
  } else {
    return unsupported(label + ": key 'topk_method': '" + topk_method +
                       "' is not supported (noaux_tc, greedy, group_limited_greedy)");
  }
  if (c.arch == Arch::kDeepseekV32 &&
      (t.index_n_heads < 1 || t.index_n_heads > 4096 || t.index_head_dim < t.qk_rope_head_dim ||
       t.index_head_dim > 4096 || t.index_topk < 1 || t.index_topk > (1 << 24)))
    return invalid_argument(label + ": keys 'index_n_heads' / 'index_head_dim' / 'index_topk' out of range "
                            "(heads 1..4096, qk_rope_head_dim ≤ head_dim ≤ 4096, topk 1..2^24)");
  if (c.arch == Arch::kDeepseekV32 && t.q_lora_rank == 0)
    return invalid_argument(label + ": key 'q_lora_rank': the V3.2 indexer needs a q_lora_rank");
  if (c.arch == Arch::kDeepseekV32 && t.index_head_dim != 128)
    return unsupported(label + ": key 'index_head_dim': only 128 is supported (one FP8 act_quant block per indexer "
                       "vector, as DeepSeek's reference requires)");
  if (c.arch == Arch::kDeepseekV32) {
    // Every V3.2 layer has an indexer (the shared DSA fields of model_config.h); its RoPE covers the
    // first qk_rope_head_dim dims with the model's table (layers/dsa_indexer.h).
    t.sparse_attn_layers.resize(static_cast<size_t>(t.num_hidden_layers));
    for (int l = 0; l < t.num_hidden_layers; ++l) t.sparse_attn_layers[static_cast<size_t>(l)] = l;
    t.attn_sparse.assign(static_cast<size_t>(t.num_hidden_layers), true);
    t.index_rope_head_dim = t.qk_rope_head_dim;
  }

  MlaRopeConfig rope;
  KESTREL_RETURN_IF_ERROR(parse_rope_config(j, label, rope));
  if (!(rope.theta > 1.0) || !std::isfinite(rope.theta)) return invalid_argument(label + ": key 'rope_theta': must be > 1");
  t.mla_rope = rope;
  KESTREL_RETURN_IF_ERROR(parse_fp8(j, label, t));

  // Softmax scale qk^-0.5 · mscale(factor, mscale_all_dim)² (transformers / vLLM: only when
  // mscale_all_dim is set; docs/model-math.md §5.3 item 6).
  double scale = 1.0 / std::sqrt(static_cast<double>(t.qk_head_dim()));
  if (rope.yarn && rope.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  t.mla_softmax_scale = static_cast<float>(scale);
  // The reference builds q_a_layernorm / kv_a_layernorm with the RMSNorm default eps (1e-6).
  t.mla_q_norm_eps = t.mla_kv_norm_eps = 1e-6f;
  t.hidden_act = Activation::kSiLU;
  t.attn_kind.assign(static_cast<size_t>(t.num_hidden_layers), AttnKind::kMla);
  t.ffn_kind.assign(static_cast<size_t>(t.num_hidden_layers), FfnKind::kDense);
  for (int l = 0; l < t.num_hidden_layers; ++l)
    if (t.num_experts > 0 && l >= t.first_k_dense_replace && l % t.moe_layer_freq == 0)
      t.ffn_kind[static_cast<size_t>(l)] = FfnKind::kMoe;
  return Status::ok();
}

}  // namespace kestrel
