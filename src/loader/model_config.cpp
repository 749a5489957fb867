#include "loader/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loader/deepseek_config.h"
#include "loader/gptoss_config.h"
#include "loader/qwen3_config.h"
#include "loader/json_reader.h"

namespace kestrel {
namespace {

using nlohmann::json;
using config_detail::check_bounds;
using config_detail::kBigSize;
using config_detail::Reader;

Status parse_linear_attn(const json& j, const std::string& where, int layers, LinearAttnConfig& la) {
  Reader r(j, where + " linear_attn_config");
  la.num_heads = r.req_int("num_heads");
  la.head_dim = r.req_int("head_dim");
  la.short_conv_kernel_size = r.req_int("short_conv_kernel_size");
  la.use_full_rank_gate = r.opt_bool("use_full_rank_gate", false);
  if (r.has("gate_lower_bound")) la.gate_lower_bound = r.req_float("gate_lower_bound");
  la.kda_layers = r.req_layer_list("kda_layers", layers);
  la.full_attn_layers = r.req_layer_list("full_attn_layers", layers);
  if (!r.status().is_ok()) return r.status();
  if (la.num_heads <= 0 || la.num_heads > 4096 || la.head_dim <= 0 || la.head_dim > 4096 ||
      la.short_conv_kernel_size < 1 || la.short_conv_kernel_size > 64)
    return invalid_argument(where + ": linear_attn_config sizes out of range (heads, head_dim ≤ 4096; conv 1..64)");
  if (la.gate_lower_bound && !(*la.gate_lower_bound < 0.0f))
    return invalid_argument(where + ": gate_lower_bound must be negative");
  return Status::ok();
}

Status parse_sparse_attn(const json& j, const std::string& where, TextConfig& t);

Status parse_text(const json& j, const std::string& where, Arch arch, TextConfig& t) {
  Reader r(j, where);
  t.vocab_size = r.req_int("vocab_size");
  t.hidden_size = r.req_int("hidden_size");
  t.num_hidden_layers = r.req_int("num_hidden_layers");
  t.num_attention_heads = r.req_int("num_attention_heads");
  t.intermediate_size = r.req_int("intermediate_size");
  const std::string act = r.req_str("hidden_act");
  t.rms_norm_eps = r.req_float("rms_norm_eps");
  t.attn_res_block_size = r.opt_int("attn_res_block_size", 0);
  t.first_k_dense_replace = r.req_int("first_k_dense_replace");
  t.moe_layer_freq = r.opt_int("moe_layer_freq", 1);
  t.num_experts = r.req_int("num_experts");
  t.num_experts_per_token = r.req_int("num_experts_per_token");
  t.num_shared_experts = r.req_int("num_shared_experts");
  t.moe_intermediate_size = r.req_int("moe_intermediate_size");
  t.routed_expert_hidden_size = r.opt_int("routed_expert_hidden_size", 0);
  t.latent_moe_use_norm = r.opt_bool("latent_moe_use_norm", false);
  t.moe_renormalize = r.opt_bool("moe_renormalize", true);
  t.routed_scaling_factor = r.opt_float("routed_scaling_factor", 1.0f);
  t.num_expert_group = r.opt_int("num_expert_group", 1);
  t.topk_group = r.opt_int("topk_group", 1);
  t.q_lora_rank = r.opt_int("q_lora_rank", 0);
  t.kv_lora_rank = r.req_int("kv_lora_rank");
  t.qk_nope_head_dim = r.req_int("qk_nope_head_dim");
  t.qk_rope_head_dim = r.req_int("qk_rope_head_dim");
  t.v_head_dim = r.req_int("v_head_dim");
  const bool nope = r.opt_bool("mla_use_nope", false);
  t.mla_use_output_gate = r.opt_bool("mla_use_output_gate", false);
  t.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  t.bos_token_id = r.opt_int("bos_token_id", -1);
  t.eos_token_id = r.opt_int("eos_token_id", -1);
  t.pad_token_id = r.opt_int("pad_token_id", -1);
  if (act == "situ") {
    t.hidden_act = Activation::kSiTU;
    t.situ_beta = r.req_float("activation_situ_beta");
    t.situ_linear_beta = r.req_float("activation_situ_linear_beta");
  } else if (act == "silu") {
    t.hidden_act = Activation::kSiLU;
  } else if (r.status().is_ok()) {
    return invalid_argument(where + ": key 'hidden_act': unsupported activation '" + act + "'");
  }
  if (r.has("moe_router_activation_func") && r.req_str("moe_router_activation_func") != "sigmoid")
    r.fail("moe_router_activation_func", "only 'sigmoid' is supported");
  if (!r.has("linear_attn_config")) r.fail("linear_attn_config", "missing required key");
  if (!r.status().is_ok()) return r.status();
  if (!nope) return unsupported(where + ": key 'mla_use_nope': only NoPE MLA (true) is supported");
  if (t.num_expert_group != 1 || t.topk_group != 1)
    return unsupported(where + ": group-limited routing (num_expert_group > 1) is not supported yet");
  KESTREL_RETURN_IF_ERROR(check_bounds(where, {
           {"vocab_size", t.vocab_size, 1, kBigSize}, {"hidden_size", t.hidden_size, 1, kBigSize},
           {"num_hidden_layers", t.num_hidden_layers, 1, 4096}, {"num_attention_heads", t.num_attention_heads, 1, 4096},
           {"intermediate_size", t.intermediate_size, 1, kBigSize}, {"attn_res_block_size", t.attn_res_block_size, 0, 4096},
           {"first_k_dense_replace", t.first_k_dense_replace, 0, 4096}, {"moe_layer_freq", t.moe_layer_freq, 1, 4096},
           {"num_experts", t.num_experts, 0, 1 << 16}, {"num_shared_experts", t.num_shared_experts, 0, 1024},
           {"moe_intermediate_size", t.moe_intermediate_size, 1, kBigSize},
           {"routed_expert_hidden_size", t.routed_expert_hidden_size, 0, kBigSize}, {"q_lora_rank", t.q_lora_rank, 0, kBigSize},
           {"kv_lora_rank", t.kv_lora_rank, 1, kBigSize}, {"qk_nope_head_dim", t.qk_nope_head_dim, 0, 1 << 16},
           {"qk_rope_head_dim", t.qk_rope_head_dim, 0, 1 << 16}, {"v_head_dim", t.v_head_dim, 1, 1 << 16}}));
  if (!(t.rms_norm_eps > 0.0f) || !(t.rms_norm_eps < 1.0f))
    return invalid_argument(where + ": key 'rms_norm_eps': must be in (0, 1)");
  if (t.qk_nope_head_dim + t.qk_rope_head_dim < 1) return invalid_argument(where + ": MLA head dims are zero");
  if (t.num_experts_per_token > t.num_experts || t.num_experts_per_token <= 0)
    return invalid_argument(where + ": num_experts_per_token must be in 1..num_experts");
  KESTREL_RETURN_IF_ERROR(parse_linear_attn(j["linear_attn_config"], where, t.num_hidden_layers, t.linear_attn));
  // Kimi Linear's reference builds its q/kv MLA norms with the RMSNorm class default eps (1e-6);
  // K3 uses rms_norm_eps for every norm (docs/model-math.md §2.6, §3.10).
  t.mla_q_norm_eps = arch == Arch::kKimiK3 ? t.rms_norm_eps : 1e-6f;
  t.mla_kv_norm_eps = arch == Arch::kKimiK3 ? t.rms_norm_eps : 1e-6f;
  t.mla_softmax_scale = 1.0f / std::sqrt(static_cast<float>(t.qk_head_dim()));

  t.attn_kind.assign(static_cast<size_t>(t.num_hidden_layers), AttnKind::kKda);
  std::vector<int> seen(static_cast<size_t>(t.num_hidden_layers), 0);
  for (int l : t.linear_attn.kda_layers) seen[static_cast<size_t>(l)]++;
  for (int l : t.linear_attn.full_attn_layers) {
    seen[static_cast<size_t>(l)]++;
    t.attn_kind[static_cast<size_t>(l)] = AttnKind::kMla;
  }
  for (int l = 0; l < t.num_hidden_layers; ++l)
    if (seen[static_cast<size_t>(l)] != 1)
      return invalid_argument(where + ": layer " + std::to_string(l + 1) +
                              " must appear in exactly one of kda_layers / full_attn_layers");
  t.ffn_kind.assign(static_cast<size_t>(t.num_hidden_layers), FfnKind::kDense);
  for (int l = 0; l < t.num_hidden_layers; ++l)
    if (t.num_experts > 0 && l >= t.first_k_dense_replace && l % t.moe_layer_freq == 0)
      t.ffn_kind[static_cast<size_t>(l)] = FfnKind::kMoe;
  return parse_sparse_attn(j, where, t);
}

// Optional K3.1-style DSA fields (names fixed: sparse_attn_layers one-based, index_n_heads, index_head_dim,
// index_topk). Either none of them or all four; sparse layers must be full-attention (MLA) layers.
Status parse_sparse_attn(const json& j, const std::string& where, TextConfig& t) {
  Reader r(j, where);
  t.attn_sparse.assign(static_cast<size_t>(t.num_hidden_layers), false);
  const bool any = r.has("sparse_attn_layers") || r.has("index_n_heads") || r.has("index_head_dim") ||
                   r.has("index_topk");
  if (!any) return Status::ok();
  t.sparse_attn_layers = r.req_layer_list("sparse_attn_layers", t.num_hidden_layers);
  t.index_n_heads = r.req_int("index_n_heads");
  t.index_head_dim = r.req_int("index_head_dim");
  t.index_topk = r.req_int("index_topk");
  t.index_rope_head_dim = r.opt_int("index_rope_head_dim", t.qk_rope_head_dim);
  t.index_rope_theta = r.opt_float("index_rope_theta", 10000.0f);
  if (!r.status().is_ok()) return r.status();
  KESTREL_RETURN_IF_ERROR(check_bounds(where, {{"index_n_heads", t.index_n_heads, 1, 4096},
                                              {"index_head_dim", t.index_head_dim, 1, 1 << 16},
                                              {"index_topk", t.index_topk, 1, 1 << 24}}));
  if (t.sparse_attn_layers.empty())
    return invalid_argument(where + ": key 'sparse_attn_layers': must name at least one layer");
  for (int l : t.sparse_attn_layers) {
    if (t.attn_sparse[static_cast<size_t>(l)])
      return invalid_argument(where + ": key 'sparse_attn_layers': layer " + std::to_string(l + 1) + " listed twice");
    if (t.attn_kind[static_cast<size_t>(l)] != AttnKind::kMla)
      return invalid_argument(where + ": key 'sparse_attn_layers': layer " + std::to_string(l + 1) +
                              " is not a full-attention layer");
    t.attn_sparse[static_cast<size_t>(l)] = true;
  }
  std::sort(t.sparse_attn_layers.begin(), t.sparse_attn_layers.end());
  // What the indexer implementation supports (kernels/cpu/dsa_indexer.h).
  if (t.index_head_dim != 128)
    return unsupported(where + ": key 'index_head_dim': only 128 is supported (one FP8 scale per indexer vector, as "
                       "DeepSeek-V3.2)");
  if (t.index_rope_head_dim < 0 || t.index_rope_head_dim > t.index_head_dim || t.index_rope_head_dim % 2 != 0)
    return invalid_argument(where + ": key 'index_rope_head_dim': must be even and in 0..index_head_dim");
  if (!(t.index_rope_theta > 1.0f) || !(t.index_rope_theta < 1e12f))
    return invalid_argument(where + ": key 'index_rope_theta': must be in (1, 1e12)");
  if (t.q_lora_rank <= 0)
    return unsupported(where + ": sparse_attn_layers need q_lora_rank > 0 (the indexer reads the MLA query latent)");
  return Status::ok();
}

// One compressed-tensors "pack-quantized" config group: only our W4A8 (int4 symmetric group weights,
// int8 dynamic per-token activations) is accepted; anything else would run with other numerics.
Status parse_int4_group(const json& g, const std::string& where, TextConfig& t) {
  const json* w = g.contains("weights") && g["weights"].is_object() ? &g["weights"] : nullptr;
  if (w == nullptr) return invalid_argument(where + ": pack-quantized group without a 'weights' object");
  Reader r(*w, where + " weights");
  const int bits = r.req_int("num_bits"), gs = r.req_int("group_size");
  const std::string type = r.req_str("type"), strategy = r.req_str("strategy");
  const bool symmetric = r.opt_bool("symmetric", false);
  if (!r.status().is_ok()) return r.status();
  if (bits != 4 || type != "int" || !symmetric || strategy != "group")
    return unsupported(where + ": pack-quantized weights must be 4-bit int, symmetric, strategy 'group'");
  if (gs != 32 && gs != 64 && gs != 128) return unsupported(where + ": group_size must be 32, 64 or 128");
  const json* a = g.contains("input_activations") && g["input_activations"].is_object() ? &g["input_activations"] : nullptr;
  if (a == nullptr)
    return unsupported(where + ": pack-quantized int4 without input_activations (W4A16) is not supported; "
                               "only W4A8 (int8 dynamic per-token activations)");
  Reader ar(*a, where + " input_activations");
  const int abits = ar.req_int("num_bits");
  const std::string atype = ar.req_str("type"), astrategy = ar.req_str("strategy");
  const bool dynamic = ar.opt_bool("dynamic", false), asym = ar.opt_bool("symmetric", false);
  if (!ar.status().is_ok()) return ar.status();
  if (abits != 8 || atype != "int" || astrategy != "token" || !dynamic || !asym)
    return unsupported(where + ": input_activations must be int8, symmetric, dynamic, strategy 'token'");
  if (t.int4_group_size != 0 && t.int4_group_size != gs)
    return unsupported(where + ": pack-quantized groups with different group sizes");
  t.int4_group_size = gs;
  return Status::ok();
}

Status parse_quant(const json& j, const std::string& where, TextConfig& t) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return Status::ok();
  const json& q = j["quantization_config"];
  Reader r(q, where + " quantization_config");
  const std::string method = r.req_str("quant_method");
  if (!r.status().is_ok()) return r.status();
  if (method != "compressed-tensors")
    return unsupported(where + ": quantization_config.quant_method '" + method + "' is not supported");
  // `value(key, default)` throws on a wrong type; untrusted JSON is type-checked first.
  auto str_of = [](const json& o, const char* k) {
    return o.is_object() && o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
  };
  const std::string fmt = str_of(q, "format");
  if (fmt == "mxfp4-pack-quantized") {
    t.experts_mxfp4 = true;
    return Status::ok();
  }
  if (fmt != "pack-quantized" && fmt != "mixed-precision")
    return unsupported(where + ": compressed-tensors format '" + fmt + "' is not supported");
  // pack-quantized (int4 everywhere quantized) or mixed-precision (per-group formats: MXFP4 experts
  // kept from the release + int4 W4A8 for the rest, as `kestrel quantize` writes).
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty())
    return invalid_argument(where + ": quantization_config.config_groups must be a non-empty object");
  for (const auto& [name, g] : q["config_groups"].items()) {
    const std::string gw = where + " quantization_config.config_groups." + name;
    if (!g.is_object()) return invalid_argument(gw + ": must be an object");
    const std::string gf = str_of(g, "format").empty() ? fmt : str_of(g, "format");
    if (gf == "mxfp4-pack-quantized") {
      t.experts_mxfp4 = true;
    } else if (gf == "pack-quantized") {
      KESTREL_RETURN_IF_ERROR(parse_int4_group(g, gw, t));
    } else {
      return unsupported(gw + ": format '" + gf + "' is not supported");
    }
  }
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& label) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(label + ": not a valid JSON object");
  ModelConfig c;
  if (!j.contains("model_type") || !j["model_type"].is_string())
    return invalid_argument(label + ": key 'model_type': missing required key");
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type == "kimi_k3") {
    c.arch = Arch::kKimiK3;
    c.weight_prefix = "language_model.";
    c.lm_head_name = "language_model.lm_head.weight";
    if (!j.contains("text_config") || !j["text_config"].is_object())
      return invalid_argument(label + ": key 'text_config': missing required key");
    const json& tj = j["text_config"];
    if (!tj.contains("model_type") || !tj["model_type"].is_string() || tj["model_type"].get<std::string>() != "kimi_linear")
      return invalid_argument(label + ": text_config.model_type must be 'kimi_linear'");
    KESTREL_RETURN_IF_ERROR(parse_text(tj, label + " text_config", c.arch, c.text));
    // The quantization block sits inside text_config in the release; accept it at top level too.
    KESTREL_RETURN_IF_ERROR(parse_quant(tj.contains("quantization_config") ? tj : j, label, c.text));
    if (c.text.attn_res_block_size <= 0)
      return invalid_argument(label + ": text_config key 'attn_res_block_size': missing required key");
    if (!c.text.latent_moe())
      return invalid_argument(label + ": text_config key 'routed_expert_hidden_size': missing required key");
    if (j.contains("vision_config")) c.vision_config_json = j["vision_config"].dump();
    config_detail::Reader top(j, label);
    // Without the key, the released layout's place (bos + 21) where the vocabulary has it; a checkpoint whose
    // vocabulary does not (a small GGUF, a text-only test model) has no image placeholder (-1).
    const int derived = c.text.bos_token_id >= 0 && c.text.bos_token_id + 21 < c.text.vocab_size ? static_cast<int>(c.text.bos_token_id + 21) : -1;
    c.media_pad_id = top.opt_int("media_placeholder_token_id", derived);
    KESTREL_RETURN_IF_ERROR(top.status());
    if (j.contains("media_placeholder_token_id") && (c.media_pad_id < 0 || c.media_pad_id >= c.text.vocab_size))
      return invalid_argument(label + ": key 'media_placeholder_token_id': " + std::to_string(c.media_pad_id) +
                              " is outside the vocabulary");
  } else if (c.model_type == "kimi_linear") {
    c.arch = Arch::kKimiLinear;
    c.lm_head_name = "lm_head.weight";
    KESTREL_RETURN_IF_ERROR(parse_text(j, label, c.arch, c.text));
    KESTREL_RETURN_IF_ERROR(parse_quant(j, label, c.text));
    if (c.text.linear_attn.use_full_rank_gate || c.text.linear_attn.gate_lower_bound)
      return unsupported(label + ": kimi_linear with K3-only KDA options; use model_type kimi_k3");
  } else if (c.model_type == "deepseek_v3" || c.model_type == "kimi_k2" || c.model_type == "deepseek_v32") {
    // Kimi K2 checkpoints are DeepseekV3ForCausalLM with their own model_type string.
    c.arch = c.model_type == "deepseek_v32" ? Arch::kDeepseekV32 : Arch::kDeepseekV3;
    KESTREL_RETURN_IF_ERROR(parse_deepseek_config(j, label, c));
  } else if (c.model_type == "qwen3_moe") {
    c.arch = Arch::kQwen3Moe;
    KESTREL_RETURN_IF_ERROR(parse_qwen3_moe_config(j, label, c));
  } else if (c.model_type == "gpt_oss") {
    c.arch = Arch::kGptOss;
    KESTREL_RETURN_IF_ERROR(parse_gpt_oss_config(j, label, c));
  } else {
    return unsupported(label + ": unknown model_type '" + c.model_type +
                       "' (supported: kimi_k3, kimi_linear, deepseek_v3, kimi_k2, deepseek_v32, qwen3_moe, gpt_oss)");
  }
  return c;
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return io_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace kestrel
