// Grouped-query attention (Qwen3-MoE, gpt-oss; docs/model-math.md §11, §12): q = x Wq (+ bq), k = x Wk (+ bk),
// v = x Wv (+ bv); RMSNorm over each q and k head where the model has it (its own weight, the model's eps); NeoX
// RoPE (rotate-half) over the whole head at the token's position, plain or YaRN (cos/sin × its magnitude); causal
// softmax attention in which query head h uses key/value head h / (heads / kv_heads), scale head_dim^-0.5, over
// the layer's sliding window where it has one, with head h's sink logit in the denominator where the model has
// sinks; out = attn Wo (+ bo).
// Cache per token: one row [k of every KV head (post-norm, post-RoPE) | v of every KV head], in the same paged
// pool and row dtypes as MLA latents (MlaCache with row.lora = 2 · kv_heads · head_dim, row.rope = 0).
// Attention: segments of up to 4 tokens (decode steps) read the rows in place (kernels/cpu/gqa_decode.h, every
// such segment of the batch in one parallel region); longer chunks run the tiled prefill kernel
// (kernels/cpu/prefill_attention.h) on keys and values decoded from the rows. Both compute the prefill kernel's
// definition, so a query's bits depend only on its position and the cached rows: one prefill, the same prompt in
// chunks, a prefix-cache hit and prefill + decode give the same logits bit for bit.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/gqa_decode.h"
#include "layers/binder.h"
#include "layers/kda_layer.h"
#include "layers/mla_layer.h"
#include "loader/model_config.h"

namespace kestrel {

class GqaLayer {
 public:
  Status bind(Binder& b, const std::string& prefix, const TextConfig& c, int layer);
  // x: [T_total, hidden] (input-normed); each segment appends its tokens to its cache and attends over it;
  // out: [T_total, hidden]. Projections run once over the batch.
  void forward(const float* x, int64_t T_total, std::span<const Segment<MlaCache>> segs, float* out);
  int64_t row_floats() const { return 2 * nkv_ * hd_; }

 private:
  void attend(int64_t off, int64_t T, const MlaCache& cache);

  const TextConfig* c_ = nullptr;
  int64_t nh_ = 0, nkv_ = 0, hd_ = 0;
  kernels::WeightMatrix wq_, wk_, wv_, wo_;
  std::vector<float> q_norm_, k_norm_, inv_freq_;
  std::vector<float> bq_, bk_, bv_, bo_, sinks_;  // empty without biases / sinks
  float scale_ = 1.0f, rope_mag_ = 1.0f;
  int64_t window_ = 0;  // sliding window (0: full causal)
  // A call's temporaries, shared by the GQA layers of the calling thread (layers/shared_temps.h): queries, the new
  // tokens' cache rows, attention output, RoPE cos/sin, one segment's packed keys and values, a decoded row.
  struct Temps {
    std::vector<float> q, rows, attn, cos, sin, kt, v, row_buf;
  };
  std::vector<kernels::GqaDecodeArgs> decode_;  // this call's decode-like segments
};

}  // namespace kestrel
