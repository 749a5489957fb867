// Random Qwen3-MoE checkpoints in the released HF layout (transformers' Qwen3MoeForCausalLM): config.json as Qwen
// ships it, bf16 tensors (embeddings, q/k/v/o, the per-head q/k norms, the router and every expert's
// gate/up/down, the final norm and lm_head).
#include <cmath>

#include "models/checkpoint_writer.h"

namespace kestrel {

using gen_detail::json;
using gen_detail::Writer;

namespace {

json qwen3_moe_config(const GenSpec& s) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", s.vocab},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.intermediate},
          {"moe_intermediate_size", s.moe_inter},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.mla_heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.head_dim},
          {"num_experts", s.experts},
          {"num_experts_per_tok", s.top_k},
          {"norm_topk_prob", s.norm_topk_prob},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 40960},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", s.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"max_window_layers", s.layers},
          {"initializer_range", 0.02},
          {"output_router_logits", false},
          {"router_aux_loss_coef", 0.001},
          {"use_cache", true},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"}};
}

}  // namespace

Status generate_qwen3_moe_checkpoint(const GenSpec& s, const std::string& dir, Progress* progress) {
  if (s.kv_heads < 1 || s.mla_heads % s.kv_heads != 0 || s.head_dim % 2 != 0 || s.experts < s.top_k || s.top_k < 1)
    return invalid_argument("qwen3_moe spec: kv_heads | heads, even head_dim, 1 ≤ top_k ≤ experts");
  std::error_code ec;
  gen_detail::fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create: " + ec.message());
  Writer w(s, progress);
  const int64_t hd = s.head_dim, q = static_cast<int64_t>(s.mla_heads) * hd, kv = static_cast<int64_t>(s.kv_heads) * hd;
  w.bf16("model.embed_tokens.weight", {s.vocab, s.hidden}, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.norm(p + "input_layernorm.weight", s.hidden);
    w.linear(p + "self_attn.q_proj", q, s.hidden);
    w.linear(p + "self_attn.k_proj", kv, s.hidden);
    w.linear(p + "self_attn.v_proj", kv, s.hidden);
    w.linear(p + "self_attn.o_proj", s.hidden, q);
    w.norm(p + "self_attn.q_norm.weight", hd);
    w.norm(p + "self_attn.k_norm.weight", hd);
    w.norm(p + "post_attention_layernorm.weight", s.hidden);
    w.bf16(p + "mlp.gate.weight", {s.experts, s.hidden}, std::sqrt(3.0f / static_cast<float>(s.hidden)));
    for (int e = 0; e < s.experts; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      w.linear(ep + "gate_proj", s.moe_inter, s.hidden);
      w.linear(ep + "up_proj", s.moe_inter, s.hidden);
      w.linear(ep + "down_proj", s.hidden, s.moe_inter);
    }
  }
  w.norm("model.norm.weight", s.hidden);
  w.linear("lm_head", s.vocab, s.hidden);
  KESTREL_RETURN_IF_ERROR(gen_detail::write_shards(w.tensors, s.shards, dir, progress));
  std::ofstream(gen_detail::fs::path(dir) / "config.json") << qwen3_moe_config(s).dump(2) << "\n";
  return Status::ok();
}

}  // namespace kestrel
