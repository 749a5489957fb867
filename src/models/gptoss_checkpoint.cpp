// Random gpt-oss checkpoints in the HF layout transformers' GptOssForCausalLM reads without quantization
// (config.json as OpenAI ships it, less the quantization_config; bf16 tensors): q/k/v/o with biases, the per-head
// sinks, the router with its bias, each layer's experts fused as gate_up_proj [E, hidden, 2·I] (gate and up
// interleaved by column) with gate_up_proj_bias [E, 2·I], down_proj [E, I, hidden] with down_proj_bias [E, hidden].
// Kestrel itself loads such a checkpoint only after llama.cpp's converter has made it a GGUF file.
#include <cmath>

#include "models/checkpoint_writer.h"

namespace kestrel {

using gen_detail::json;
using gen_detail::Writer;

namespace {

json gpt_oss_config(const GenSpec& s) {
  json types = json::array();
  for (int l = 0; l < s.layers; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  return {{"architectures", {"GptOssForCausalLM"}},
          {"model_type", "gpt_oss"},
          {"vocab_size", s.vocab},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.moe_inter},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.mla_heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.head_dim},
          {"num_local_experts", s.experts},
          {"num_experts_per_tok", s.top_k},
          {"experts_per_token", s.top_k},
          {"layer_types", types},
          {"sliding_window", s.sliding_window},
          {"hidden_act", "silu"},
          {"swiglu_limit", 7.0},
          {"max_position_embeddings", 131072},
          {"initial_context_length", 4096},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 150000.0},
          {"rope_scaling",
           {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
            {"original_max_position_embeddings", 4096}, {"truncate", false}}},
          {"attention_bias", true},
          {"attention_dropout", 0.0},
          {"router_aux_loss_coef", 0.9},
          {"output_router_logits", false},
          {"use_cache", true},
          {"initializer_range", 0.02},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"pad_token_id", 2},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"}};
}

}  // namespace

Status generate_gpt_oss_checkpoint(const GenSpec& s, const std::string& dir, Progress* progress) {
  if (s.kv_heads < 1 || s.mla_heads % s.kv_heads != 0 || s.head_dim % 2 != 0 || s.experts < s.top_k || s.top_k < 1 ||
      s.sliding_window < 1)
    return invalid_argument("gpt_oss spec: kv_heads | heads, even head_dim, 1 ≤ top_k ≤ experts, window ≥ 1");
  std::error_code ec;
  gen_detail::fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create: " + ec.message());
  Writer w(s, progress);
  const int64_t hd = s.head_dim, q = static_cast<int64_t>(s.mla_heads) * hd, kv = static_cast<int64_t>(s.kv_heads) * hd;
  const int64_t E = s.experts, H = s.hidden, I = s.moe_inter;
  const float in_h = std::sqrt(3.0f / static_cast<float>(H)), in_i = std::sqrt(3.0f / static_cast<float>(I));
  w.bf16("model.embed_tokens.weight", {s.vocab, H}, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.norm(p + "input_layernorm.weight", H);
    w.linear(p + "self_attn.q_proj", q, H);
    w.linear(p + "self_attn.k_proj", kv, H);
    w.linear(p + "self_attn.v_proj", kv, H);
    w.linear(p + "self_attn.o_proj", H, q);
    w.bf16(p + "self_attn.q_proj.bias", {q}, 0.1f);
    w.bf16(p + "self_attn.k_proj.bias", {kv}, 0.1f);
    w.bf16(p + "self_attn.v_proj.bias", {kv}, 0.1f);
    w.bf16(p + "self_attn.o_proj.bias", {H}, 0.1f);
    w.bf16(p + "self_attn.sinks", {s.mla_heads}, 1.0f);
    w.norm(p + "post_attention_layernorm.weight", H);
    w.bf16(p + "mlp.router.weight", {E, H}, in_h);
    w.bf16(p + "mlp.router.bias", {E}, 0.1f);
    w.bf16(p + "mlp.experts.gate_up_proj", {E, H, 2 * I}, in_h);
    w.bf16(p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, 0.1f);
    w.bf16(p + "mlp.experts.down_proj", {E, I, H}, in_i);
    w.bf16(p + "mlp.experts.down_proj_bias", {E, H}, 0.1f);
  }
  w.norm("model.norm.weight", H);
  w.linear("lm_head", s.vocab, H);
  KESTREL_RETURN_IF_ERROR(gen_detail::write_shards(w.tensors, s.shards, dir, progress));
  std::ofstream(gen_detail::fs::path(dir) / "config.json") << gpt_oss_config(s).dump(2) << "\n";
  return Status::ok();
}

}  // namespace kestrel
