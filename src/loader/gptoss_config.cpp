#include "loader/gptoss_config.h"

#include <cmath>
#include <initializer_list>

#include "loader/deepseek_config.h"
#include "loader/json_reader.h"

namespace kestrel {

using config_detail::check_bounds;
using config_detail::kBigSize;
using config_detail::Reader;
using nlohmann::json;

Status parse_gpt_oss_config(const json& j, const std::string& label, ModelConfig& c) {
  c.weight_prefix = "";
  c.lm_head_name = "lm_head.weight";
  TextConfig& t = c.text;
  Reader r(j, label);
  t.vocab_size = r.req_int("vocab_size");
  t.hidden_size = r.req_int("hidden_size");
  t.num_hidden_layers = r.req_int("num_hidden_layers");
  t.num_attention_heads = r.req_int("num_attention_heads");
  t.num_key_value_heads = r.opt_int("num_key_value_heads", t.num_attention_heads);
  t.head_dim = r.opt_int("head_dim", t.num_attention_heads > 0 ? t.hidden_size / t.num_attention_heads : 0);
  // Every layer is MoE; intermediate_size is each expert's width (GptOssExperts).
  t.moe_intermediate_size = r.req_int("intermediate_size");
  t.num_experts = r.req_int("num_local_experts");
  t.num_experts_per_token = r.opt_int("num_experts_per_tok", 4);
  t.rms_norm_eps = r.opt_float("rms_norm_eps", 1e-5f);
  t.swiglu_alpha = r.opt_float("swiglu_alpha", 1.702f);
  t.swiglu_limit = r.opt_float("swiglu_limit", 7.0f);
  const int window = r.opt_int("sliding_window", 128);
  t.attention_bias = r.opt_bool("attention_bias", true);
  t.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  t.bos_token_id = r.has("bos_token_id") && j["bos_token_id"].is_number_integer() ? r.req_int("bos_token_id") : -1;
  t.eos_token_id = r.has("eos_token_id") && j["eos_token_id"].is_number_integer() ? r.req_int("eos_token_id") : -1;
  KESTREL_RETURN_IF_ERROR(r.status());
  if (r.has("quantization_config") && !j["quantization_config"].is_null())
    return unsupported(label + ": key 'quantization_config': quantized gpt-oss safetensors checkpoints are not "
                               "supported (convert to GGUF with llama.cpp's converter)");

  // transformers' default RoPE for gpt-oss: YaRN, factor 32 over 4096 positions, beta 32 / 1, exact ramp ends.
  MlaRopeConfig& rope = t.gqa_rope;
  if (!j.contains("rope_scaling") && !j.contains("rope_parameters")) {
    rope.theta = 150000.0;
    rope.yarn = true;
    rope.factor = 32.0;
    rope.beta_fast = 32.0;
    rope.beta_slow = 1.0;
    rope.original_max_position_embeddings = 4096;
    rope.truncate = false;
  }
  json rj = j;
  if (!rj.contains("rope_theta") && !(rj.contains("rope_parameters") && rj["rope_parameters"].is_object() &&
                                      rj["rope_parameters"].contains("rope_theta")))
    rj["rope_theta"] = 150000.0;
  if (j.contains("rope_scaling") || j.contains("rope_parameters"))
    KESTREL_RETURN_IF_ERROR(parse_rope_config(rj, label, rope));
  if (rope.yarn && (rope.mscale != 1.0 || rope.mscale_all_dim != 0.0))
    return unsupported(label + ": key 'rope_scaling': mscale / mscale_all_dim are not supported for gpt-oss");

  KESTREL_RETURN_IF_ERROR(check_bounds(label, {
           {"vocab_size", t.vocab_size, 1, kBigSize}, {"hidden_size", t.hidden_size, 1, kBigSize},
           {"num_hidden_layers", t.num_hidden_layers, 1, 4096}, {"num_attention_heads", t.num_attention_heads, 1, 4096},
           {"num_key_value_heads", t.num_key_value_heads, 1, 4096}, {"head_dim", t.head_dim, 2, 4096},
           {"intermediate_size", t.moe_intermediate_size, 1, kBigSize}, {"num_local_experts", t.num_experts, 1, 1 << 16},
           {"sliding_window", window, 0, kBigSize}}));
  if (t.num_attention_heads % t.num_key_value_heads != 0)
    return invalid_argument(label + ": key 'num_key_value_heads': must divide num_attention_heads");
  if (t.head_dim % 2 != 0) return invalid_argument(label + ": key 'head_dim': must be even (RoPE rotates halves)");
  if (t.num_experts_per_token < 1 || t.num_experts_per_token > t.num_experts)
    return invalid_argument(label + ": key 'num_experts_per_tok': must be in 1..num_local_experts");
  if (!(t.rms_norm_eps > 0.0f) || !(t.rms_norm_eps < 1.0f))
    return invalid_argument(label + ": key 'rms_norm_eps': must be in (0, 1)");
  if (!(t.swiglu_limit > 0.0f) || !std::isfinite(t.swiglu_limit) || !std::isfinite(t.swiglu_alpha))
    return invalid_argument(label + ": key 'swiglu_limit': must be a positive number (and swiglu_alpha finite)");
  if (!(t.gqa_rope.theta > 1.0) || !std::isfinite(t.gqa_rope.theta))
    return invalid_argument(label + ": key 'rope_theta': must be > 1");

  // layer_types: "sliding_attention" / "full_attention"; transformers' default alternates, sliding first.
  t.gqa_window.assign(static_cast<size_t>(t.num_hidden_layers), 0);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& v = j["layer_types"];
    if (!v.is_array() || static_cast<int64_t>(v.size()) != t.num_hidden_layers)
      return invalid_argument(label + ": key 'layer_types': must list one type per layer");
    for (size_t l = 0; l < v.size(); ++l) {
      const std::string ty = v[l].is_string() ? v[l].get<std::string>() : "";
      if (ty != "sliding_attention" && ty != "full_attention")
        return unsupported(label + ": key 'layer_types': entry " + std::to_string(l) + " must be 'sliding_attention' or "
                                   "'full_attention'");
      t.gqa_window[l] = ty == "sliding_attention" ? window : 0;
    }
  } else {
    for (size_t l = 0; l < t.gqa_window.size(); l += 2) t.gqa_window[l] = window;
  }
  for (int w : t.gqa_window)
    if (w == 0) continue;
    else if (w < 1) return invalid_argument(label + ": key 'sliding_window': must be ≥ 1 on sliding layers");

  // Router: Linear with bias, top-k on the logits, softmax over the k chosen (= the softmax over all experts
  // renormalised over the chosen); experts with biases and the clamped SwiGLU; no shared experts, no groups.
  t.router_scoring = RouterScoring::kSoftmax;
  t.moe_renormalize = true;
  t.router_bias = false;
  t.router_logit_bias = true;
  t.expert_bias = true;
  t.num_expert_group = t.topk_group = 1;
  t.num_shared_experts = 0;
  t.routed_scaling_factor = 1.0f;
  t.qk_norm = false;
  t.attn_sinks = true;
  t.hidden_act = Activation::kSwiGluOai;
  t.first_k_dense_replace = 0;
  t.intermediate_size = 0;
  t.attn_kind.assign(static_cast<size_t>(t.num_hidden_layers), AttnKind::kGqa);
  t.ffn_kind.assign(static_cast<size_t>(t.num_hidden_layers), FfnKind::kMoe);
  return Status::ok();
}

}  // namespace kestrel
