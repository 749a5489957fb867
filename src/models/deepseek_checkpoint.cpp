// Random DeepSeek V3 / V3.2 checkpoints in the released HF layout (docs/model-math.md §5.2, §6.2,
// §8): config.json as DeepSeek ships it (rope_scaling yarn, noaux_tc, fp8 quantization_config),
// FP8 e4m3 linears with weight_scale_inv, bf16 embeddings / lm_head / norms / router, fp32 router bias.
#include <cmath>

#include "models/checkpoint_writer.h"

namespace kestrel {

using gen_detail::fp8_block_linear;
using gen_detail::json;
using gen_detail::Rng;
using gen_detail::Writer;

namespace {

struct DsWriter {
  Writer& w;
  const GenSpec& s;
  void linear(const std::string& name, int64_t out, int64_t in) {
    if (s.fp8) fp8_block_linear(w, name, out, in, s.seed);
    else w.linear(name, out, in);
  }
  void mlp(const std::string& p, int64_t inter) {
    linear(p + "gate_proj", inter, s.hidden);
    linear(p + "up_proj", inter, s.hidden);
    linear(p + "down_proj", s.hidden, inter);
  }
  void attention(const std::string& p) {
    const int64_t nh = s.mla_heads, qk = s.nope + s.rope;
    if (s.q_lora > 0) {
      linear(p + "q_a_proj", s.q_lora, s.hidden);
      w.norm(p + "q_a_layernorm.weight", s.q_lora);
      linear(p + "q_b_proj", nh * qk, s.q_lora);
    } else {
      linear(p + "q_proj", nh * qk, s.hidden);
    }
    linear(p + "kv_a_proj_with_mqa", s.kv_lora + s.rope, s.hidden);
    w.norm(p + "kv_a_layernorm.weight", s.kv_lora);
    linear(p + "kv_b_proj", nh * (s.nope + s.v_dim), s.kv_lora);
    linear(p + "o_proj", s.hidden, nh * s.v_dim);
    if (s.arch == "deepseek_v32") {  // lightning indexer (weights_proj stays bf16 in the release)
      const int64_t H = s.index_heads, D = s.index_dim;
      linear(p + "indexer.wq_b", H * D, s.q_lora);
      linear(p + "indexer.wk", D, s.hidden);
      w.norm(p + "indexer.k_norm.weight", D);
      w.bf16(p + "indexer.k_norm.bias", {D}, 0.1f);
      w.linear(p + "indexer.weights_proj", H, s.hidden);
    }
  }
  void moe(const std::string& p) {
    w.bf16(p + "gate.weight", {s.experts, s.hidden}, std::sqrt(3.0f / static_cast<float>(s.hidden)));
    if (s.topk_method == "noaux_tc")
      w.f32(p + "gate.e_score_correction_bias", {s.experts}, [](Rng& r, int64_t) { return 0.05f * r.sym(); });
    for (int e = 0; e < s.experts; ++e) mlp(p + "experts." + std::to_string(e) + ".", s.moe_inter);
    if (s.shared > 0) mlp(p + "shared_experts.", static_cast<int64_t>(s.shared) * s.moe_inter);
  }
};

json deepseek_config(const GenSpec& s) {
  const bool v32 = s.arch == "deepseek_v32";
  json c = {{"architectures", {v32 ? "DeepseekV32ForCausalLM" : "DeepseekV3ForCausalLM"}},
            {"model_type", s.arch}, {"vocab_size", s.vocab}, {"hidden_size", s.hidden},
            {"intermediate_size", s.intermediate}, {"moe_intermediate_size", s.moe_inter},
            {"num_hidden_layers", s.layers}, {"num_nextn_predict_layers", s.mtp_layers},
            {"num_attention_heads", s.mla_heads}, {"num_key_value_heads", s.mla_heads},
            {"n_shared_experts", s.shared}, {"n_routed_experts", s.experts}, {"ep_size", 1},
            {"routed_scaling_factor", s.routed_scaling}, {"kv_lora_rank", s.kv_lora},
            {"q_lora_rank", s.q_lora > 0 || s.q_lora_zero_key ? json(s.q_lora) : json(nullptr)}, {"qk_rope_head_dim", s.rope},
            {"v_head_dim", s.v_dim}, {"qk_nope_head_dim", s.nope}, {"topk_method", s.topk_method},
            {"n_group", s.n_group}, {"topk_group", s.topk_group}, {"num_experts_per_tok", s.top_k},
            {"moe_layer_freq", 1}, {"first_k_dense_replace", s.first_k_dense}, {"norm_topk_prob", s.norm_topk_prob},
            {"scoring_func", s.topk_method == "noaux_tc" ? "sigmoid" : "softmax"}, {"hidden_act", "silu"},
            {"max_position_embeddings", 163840},
            {"initializer_range", 0.02}, {"rms_norm_eps", 1e-6}, {"use_cache", true},
            {"bos_token_id", 0}, {"eos_token_id", 1}, {"tie_word_embeddings", false},
            {"rope_theta", s.rope_theta},
            {"rope_scaling", {{"type", "yarn"}, {"factor", s.yarn_factor},
                              {"original_max_position_embeddings", s.yarn_original_max}, {"beta_fast", 32},
                              {"beta_slow", 1}, {"mscale", s.yarn_mscale}, {"mscale_all_dim", s.yarn_mscale_all_dim}}},
            {"attention_bias", false}, {"attention_dropout", 0.0}, {"torch_dtype", "bfloat16"}};
  if (s.fp8)
    c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}}};
  if (v32) c["index_n_heads"] = s.index_heads, c["index_head_dim"] = s.index_dim, c["index_topk"] = s.index_topk;
  return c;
}

}  // namespace

Status generate_deepseek_checkpoint(const GenSpec& s, const std::string& dir, Progress* progress) {
  if (s.first_k_dense > s.layers || s.experts % s.n_group != 0 || s.rope % 2 != 0)
    return invalid_argument("deepseek spec: first_k_dense ≤ layers, n_group | experts, even rope dim");
  std::error_code ec;
  gen_detail::fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create: " + ec.message());
  Writer w(s, progress);
  DsWriter d{w, s};
  w.bf16("model.embed_tokens.weight", {s.vocab, s.hidden}, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.norm(p + "input_layernorm.weight", s.hidden);
    w.norm(p + "post_attention_layernorm.weight", s.hidden);
    d.attention(p + "self_attn.");
    if (l < s.first_k_dense) d.mlp(p + "mlp.", s.intermediate);
    else d.moe(p + "mlp.");
  }
  for (int k = 0; k < s.mtp_layers; ++k) {  // a few of the MTP tensors, enough to exercise skipping
    const std::string p = "model.layers." + std::to_string(s.layers + k) + ".";
    w.norm(p + "enorm.weight", s.hidden);
    w.norm(p + "hnorm.weight", s.hidden);
    d.linear(p + "eh_proj", s.hidden, 2 * static_cast<int64_t>(s.hidden));
    w.norm(p + "shared_head.norm.weight", s.hidden);
  }
  w.norm("model.norm.weight", s.hidden);
  w.linear("lm_head", s.vocab, s.hidden);
  KESTREL_RETURN_IF_ERROR(gen_detail::write_shards(w.tensors, s.shards, dir, progress));
  std::ofstream(gen_detail::fs::path(dir) / "config.json") << deepseek_config(s).dump(2) << "\n";
  return Status::ok();
}

}  // namespace kestrel
