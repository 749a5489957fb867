// Deterministic random checkpoints in the exact released layout (config.json, safetensors shards,
// model.safetensors.index.json) for K3, Kimi Linear, DeepSeek V3 and V3.2. Used by tests, benchmarks and the
// embedded default model. Weights are random: outputs are meaningless text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel {

struct GenSpec {
  std::string arch = "kimi_k3";  // or "kimi_linear", "deepseek_v3", "deepseek_v32", "qwen3_moe", "gpt_oss"
  int vocab = 512, hidden = 256, layers = 9, intermediate = 512;
  int mla_heads = 2, kda_heads = 2, head_dim = 128;
  std::vector<int> full_attn_layers = {4, 8, 9};  // one-based; the rest are KDA
  int attn_res_block = 4;
  int experts = 16, top_k = 4, shared = 2, moe_inter = 64, latent = 128;
  int q_lora = 64, kv_lora = 512, nope = 128, rope = 64, v_dim = 128;
  bool mxfp4_experts = true;
  // DSA (ours, see model_config.h): one-based full-attention layers that get an indexer.
  std::vector<int> sparse_attn_layers;
  int index_heads = 4, index_dim = 128, index_topk = 16;
  int index_rope = -1;  // index_rope_head_dim written to config.json when ≥ 0 (else the default)
  float routed_scaling = 1.0f;
  int shards = 2;
  uint64_t seed = 1;
  // A_log stored padded to head_dim (K3 release) or [1,1,H,1] (Kimi Linear).
  bool pad_a_log = true;
  // DeepSeek only (mla_heads = attention heads; the MLA, MoE and dense sizes above are shared).
  int first_k_dense = 2, n_group = 4, topk_group = 2;
  bool fp8 = true;  // FP8 128×128 block weights for every linear except embed, lm_head, router
  double rope_theta = 10000.0, yarn_factor = 40.0, yarn_mscale = 1.0, yarn_mscale_all_dim = 1.0;
  int yarn_original_max = 4096;
  bool q_lora_zero_key = false;  // q_lora 0 written to config.json as 0 (llama.cpp's converter then keeps the key), not null
  int mtp_layers = 0;  // extra MTP layer tensors after the main layers (accepted, not run)
  int kv_heads = 2;    // Qwen3-MoE / gpt-oss: key/value heads (mla_heads = query heads, head_dim their width)
  int sliding_window = 128;  // gpt-oss: the window of its even layers
  // Routing: "noaux_tc" (sigmoid + correction bias) or V2-style softmax "greedy" / "group_limited_greedy"
  // (no bias tensor); norm_topk_prob as written to config.json.
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  // K3 only: the vision tower + projector in the released layout (MoonViT3d blocks, PatchMergerMLPV2), with
  // small widths (the text path validates and skips them); a full vision_config with these values is written.
  int vt_layers = 2, vt_hidden = 64, vt_intermediate = 128, vt_heads = 2, vt_qkv = 64, vt_patch = 14, vt_pos_grid = 8;
};

// Named presets: "k3-tiny", "k3-tiny-bf16", "kimi-linear-tiny", "k3-bench", "k3-default",
// "deepseek-v3-tiny", "deepseek-v32-tiny", "deepseek-v32-sparse-tiny" (V3.2 with index_topk 8),
// "deepseek-v2style-tiny", "deepseek-v3-micro-bf16" / "deepseek-v2-lite-micro-bf16" (DeepSeek V3 / V2-Lite
// structure at micro widths in BF16: the source of the deepseek2 GGUF test files), "deepseek2-lite-bench"
// (DeepSeek-V2-Lite layer widths, 4 layers, BF16), "deepseek-bench", "deepseek-bench-dsa" (deepseek-bench as V3.2: indexer on every
// layer, 8 × 128, top-2048).
// "k3-tiny-dsa" (layers 4 and 8 sparse, top-16), "k3-bench-dsa" (k3-bench with both MLA layers sparse,
// top-2048; every tensor shared with k3-bench is identical). "kimi-linear-bench" (Kimi-Linear-48B-A3B layer widths,
// 3 KDA + 1 MLA, 64 experts top-8) and "k3-shape-bench" (K3 layer widths: KDA + dense, MLA + LatentMoE with 32
// MXFP4 experts top-8), vocab 32768: the llama.cpp side-by-side benchmark (bench/llama_cpp_compare.py).
// "qwen3moe-micro-bf16" (Qwen3-MoE structure at micro widths, BF16: the source of the qwen3moe GGUF test files) and
// "qwen3moe-bench" (Qwen3-30B-A3B layer widths, 8 of its 48 layers, vocab 32768, BF16: the side-by-side benchmark);
// "gptoss-bench" (gpt-oss-20b layer widths, 4 of its 24 layers, vocab 32768, BF16 in transformers' unquantized
// gpt-oss layout: the side-by-side benchmark quantizes its experts to MXFP4 with llama.cpp).
Result<GenSpec> gen_preset(const std::string& name);
std::vector<std::string> gen_preset_names();

class Progress;

// Writes config.json + shards + index into `dir` (created if missing). `progress` (optional) counts the
// tensors generated, then restarts for the bytes written.
Status generate_checkpoint(const GenSpec& spec, const std::string& dir, Progress* progress = nullptr);

}  // namespace kestrel
