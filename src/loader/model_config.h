// Typed model configuration, parsed once from config.json. Nothing below models/ reads JSON.
// K3: model_type "kimi_k3" with text_config of type "kimi_linear" (+ vision_config kept for later).
// Kimi Linear: model_type "kimi_linear" at top level. Layer lists in the file are ONE-based.
// DeepSeek V3 / Kimi K2 ("deepseek_v3", "kimi_k2") and V3.2 ("deepseek_v32"): flat HF config with
// MLA + decoupled (YaRN) RoPE, noaux_tc group-limited routing, optional FP8 block weights
// (parsed in deepseek_config.cpp).
// Qwen3-MoE ("qwen3_moe", Qwen3MoeForCausalLM): grouped-query attention with per-head q/k RMSNorm and NeoX RoPE,
// softmax top-k MoE without shared experts (parsed in qwen3_config.cpp).
// gpt-oss ("gpt_oss", GptOssForCausalLM): grouped-query attention with biases, sinks, alternating sliding window
// and YaRN; softmax-over-the-chosen-k MoE with biased router and experts and the clamped SwiGLU (gptoss_config.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel {

enum class Arch { kKimiK3, kKimiLinear, kDeepseekV3, kDeepseekV32, kQwen3Moe, kGptOss };
enum class Activation { kSiLU, kSiTU, kSwiGluOai };
// kMla layers listed in sparse_attn_layers also run the DSA indexer; kGqa: grouped-query attention (Qwen3-MoE),
// whose cached rows [keys of every KV head | values of every KV head] live in the same paged pool as MLA latents.
enum class AttnKind { kKda, kMla, kGqa };
enum class FfnKind { kDense, kMoe };
enum class RouterScoring { kSigmoid, kSoftmax };

// Decoupled RoPE on the MLA rope dims (DeepSeek; docs/model-math.md §5.4). Absent for NoPE MLA.
// Pairs (2i, 2i+1) of q_pe / k_pe are rotated by pos · inv_freq[i] (interleaved, GPT-J style).
struct MlaRopeConfig {
  double theta = 10000.0;
  bool yarn = false;  // rope_scaling type "yarn"; the fields below apply only then
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;  // 0 = key absent (vLLM / transformers defaults)
  int original_max_position_embeddings = 0;
  // The ramp's ends [low, high] rounded out to whole pairs (floor / ceil), as DeepSeek's code, llama.cpp and
  // transformers' default do; gpt-oss's config says "truncate": false (the exact ends).
  bool truncate = true;
};

struct LinearAttnConfig {
  int num_heads = 0;
  int head_dim = 0;
  int short_conv_kernel_size = 0;
  bool use_full_rank_gate = false;          // K3: single g_proj [P, hidden]; Kimi Linear: g_a/g_b low rank
  std::optional<float> gate_lower_bound;    // K3: -5 → bounded sigmoid gate; absent → -exp(A)·softplus
  std::vector<int> kda_layers;              // zero-based
  std::vector<int> full_attn_layers;        // zero-based
};

struct TextConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int intermediate_size = 0;  // dense MLP (layer 0)
  Activation hidden_act = Activation::kSiLU;
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  // Activation::kSwiGluOai (gpt-oss): g' = min(g, limit), u' = clamp(u, −limit, limit),
  // act = g' · sigmoid(alpha · g') · (u' + 1).
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  float rms_norm_eps = 1e-5f;
  int attn_res_block_size = 0;  // 0 = plain additive residual (Kimi Linear)

  int first_k_dense_replace = 1;
  int moe_layer_freq = 1;
  int num_experts = 0;
  int num_experts_per_token = 0;
  int num_shared_experts = 0;
  int moe_intermediate_size = 0;
  int routed_expert_hidden_size = 0;  // > 0 → LatentMoE (K3)
  bool latent_moe_use_norm = false;
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.0f;
  int num_expert_group = 1;
  int topk_group = 1;
  RouterScoring router_scoring = RouterScoring::kSigmoid;
  // e_score_correction_bias present (noaux_tc). Group score = sum of the top-2 biased scores in a
  // group when true, the group max otherwise (group_limited_greedy).
  bool router_bias = true;
  // gpt-oss: the router is a Linear with a bias (added to the logits before the choice), and every routed
  // expert's gate, up and down projections carry biases.
  bool router_logit_bias = false;
  bool expert_bias = false;

  int q_lora_rank = 0;  // 0 → plain q_proj (Kimi Linear)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool mla_use_output_gate = false;
  float mla_q_norm_eps = 1e-5f;
  float mla_kv_norm_eps = 1e-5f;  // Kimi Linear's reference uses the RMSNorm class default 1e-6
  std::optional<MlaRopeConfig> mla_rope;  // DeepSeek: decoupled RoPE; absent → NoPE (Kimi)
  float mla_softmax_scale = 0.0f;        // qk_head_dim^-0.5 (× YaRN mscale² for DeepSeek)
  int num_nextn_predict_layers = 0;  // MTP layers stored after the main layers (not run)

  // Grouped-query attention (AttnKind::kGqa): num_key_value_heads heads of head_dim for keys and values, shared
  // by num_attention_heads / num_key_value_heads query heads each; q and k RMSNorm per head (qk_norm, eps
  // rms_norm_eps) before NeoX RoPE (rotate-half) over the whole head with gqa_rope's frequencies (plain at its
  // theta, or YaRN-blended with its cos/sin magnitude); softmax scale head_dim^-0.5.
  // gpt-oss adds q/k/v/o biases (attention_bias), one learned sink logit per query head (attn_sinks: the
  // softmax denominator gains exp(sink)) and a sliding window on some layers (gqa_window[l] = W > 0: a query at
  // position p sees keys j with p − j < W; 0 = full causal).
  int num_key_value_heads = 0;
  int head_dim = 0;
  bool qk_norm = false;
  MlaRopeConfig gqa_rope;
  bool attention_bias = false;
  bool attn_sinks = false;
  std::vector<int> gqa_window;  // per layer (empty: every layer full)
  int gqa_row_floats() const { return 2 * num_key_value_heads * head_dim; }

  // DSA (DeepSeek-V3.2 lightning indexer) on some full-attention layers. DeepSeek V3.2 (deepseek_v32):
  // every layer, sizes from its config (index_n_heads, index_head_dim, index_topk), rope dims =
  // qk_rope_head_dim with the model's own RoPE table. K3: these keys are OURS until a
  // K3.1 config is public (docs/model-math.md §2.8): `sparse_attn_layers` (one-based, each must be a
  // full_attn layer), `index_n_heads`, `index_head_dim` (128: one FP8 scale per vector, as V3.2),
  // `index_topk`, plus `index_rope_head_dim` (default qk_rope_head_dim; 0 = no RoPE) and
  // `index_rope_theta` (default 10000, plain frequencies — K3 has no rope block). Scales are ue8m0.
  std::vector<int> sparse_attn_layers;  // zero-based
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int index_rope_head_dim = 0;
  float index_rope_theta = 10000.0f;
  std::vector<bool> attn_sparse;  // per layer: MLA layer with an indexer

  bool tie_word_embeddings = false;
  int bos_token_id = -1;
  int eos_token_id = -1;
  int pad_token_id = -1;
  bool experts_mxfp4 = false;  // compressed-tensors mxfp4-pack-quantized declared
  int int4_group_size = 0;     // compressed-tensors pack-quantized int4 (our W4A8) declared: 32, 64 or 128
  bool weights_fp8_block = false;  // DeepSeek fp8: e4m3 weights + weight_scale_inv per 128×128 block


  LinearAttnConfig linear_attn;
  std::vector<AttnKind> attn_kind;  // per layer
  std::vector<FfnKind> ffn_kind;    // per layer

  int kda_proj_size() const { return linear_attn.num_heads * linear_attn.head_dim; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool latent_moe() const { return routed_expert_hidden_size > 0; }
  bool has_sparse_attn() const { return !sparse_attn_layers.empty(); }
};

struct ModelConfig {
  Arch arch = Arch::kKimiK3;
  std::string model_type;
  std::string weight_prefix;  // "language_model." for K3, "" otherwise
  std::string lm_head_name;   // full tensor name
  TextConfig text;
  std::string vision_config_json;  // kept verbatim for the vision tower (not used by the text path)
  // K3: the <|media_pad|> id whose prompt positions take image embeddings: media_placeholder_token_id, or
  // without it the K3 special-token table's (bos_token_id + 21; docs/vision.md §6). -1: none.
  int media_pad_id = -1;
};

// Parses config.json text; `label` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& label);
Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace kestrel
