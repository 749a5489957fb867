// DSA lightning indexer layer (DeepSeek-V3.2, docs/model-math.md §6.2-6.3), attached to an MLA
// layer listed in `sparse_attn_layers`. Tensors (DeepSeek names, under `<layer>.self_attn.indexer.`):
//   wq_b [H·D, q_lora]  (query from the MLA q latent c_q, after q_a_layernorm)
//   wk [D, hidden], k_norm.{weight,bias} [D]  (one LayerNorm'd key per token, eps 1e-6)
//   weights_proj [H, hidden]  (per-head gate)
// Per token at position p: q = wq_b c_q → [H, D]; k = LayerNorm(wk x); NeoX RoPE on the first `rope`
// dims of every q head and of k; Hadamard on each 128-vector; act_quant (ue8m0) → e4m3 codes + scale;
// w_h = weights_proj(x)_h · H^-0.5 · D^-0.5 · qscale_h. The key row goes to the indexer cache; each
// query selects its top-k cached positions (kernels::indexer_topk).
// RoPE table (a parameter, DsaIndexerDims::inv_freq / rope_mag), chosen by bind() from the config:
//  - DeepSeek V3.2 (config has the MLA's decoupled RoPE): the MODEL's table — the same (YaRN) inv_freq
//    and cos/sin magnitude as the MLA rope dims (layers/rope.h), but applied NeoX / half-split, not
//    interleaved (DeepSeek's 2025-11-17 indexer fix; transformers DeepseekV32Indexer passes the model's
//    position_embeddings to apply_rotary_pos_emb; docs/model-math.md §6.3 step 3). The magnitude
//    follows transformers (its cos/sin carry the YaRN attention factor); DeepSeek's reference uses unit
//    cos/sin. Both are 1 for every released config (mscale == mscale_all_dim); a config where they
//    differ has not been checked against any reference.
//  - K3 assumption (no public K3.1 config): the DSA template of docs/model-math.md §2.8 — partial NeoX
//    RoPE with plain frequencies (index_rope_theta) although K3's MLA itself is NoPE.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "layers/binder.h"
#include "layers/kda_layer.h"
#include "loader/model_config.h"

namespace kestrel {

// Per-sequence indexer key cache of one layer: a VIEW of byte pages (owned by a SequenceState or
// cache/). Token j's row [D e4m3 codes | fp32 scale] is at pages[j / page_tokens] + (j % page_tokens) · row.
struct IndexerCache {
  std::vector<uint8_t*> pages;
  int64_t page_tokens = 0;
  int64_t n_tokens = 0;
  int64_t capacity() const { return static_cast<int64_t>(pages.size()) * page_tokens; }
};

struct DsaIndexerDims {
  int64_t hidden = 0, q_lora = 0, H = 0, D = 0, rope = 0, topk = 0;
  float rope_theta = 10000.0f;  // plain frequencies theta^(-2i/rope), used when inv_freq is empty
  std::vector<float> inv_freq;  // [rope/2] explicit table (the model's RoPE); overrides rope_theta
  float rope_mag = 1.0f;        // cos/sin magnitude (YaRN attention factor; 1 otherwise)
  bool ue8m0 = true;
};

class DsaIndexer {
 public:
  Status bind(Binder& b, const std::string& prefix, const TextConfig& c);
  // Direct initialisation (tests): fp32/bf16 weights as WeightMatrix views the caller keeps alive.
  void init(const DsaIndexerDims& d, kernels::WeightMatrix wq_b, kernels::WeightMatrix wk,
            kernels::WeightMatrix weights_proj, std::vector<float> k_norm_w, std::vector<float> k_norm_b);
  const DsaIndexerDims& dims() const { return d_; }
  int64_t row_bytes() const;

  // x: [T_total, hidden] normed layer input; qr: [T_total, q_lora] MLA q latent. For each segment:
  // appends its keys to its cache (positions cache.n_tokens ...) and writes the segment's top-k
  // positions to idx[(offset + t) · topk ...] (ascending, −1 padded).
  void forward(const float* x, const float* qr, int64_t T_total, std::span<const Segment<IndexerCache>> segs,
               int32_t* idx);

  // Exposed for tests: after forward(), the rotated pre-quantization q [T_total, H, D] / k [T_total, D],
  // the q codes and the folded head weights [T_total, H].
  const std::vector<float>& q_pre() const { return q_; }
  const std::vector<float>& k_pre() const { return k_; }
  const std::vector<uint8_t>& q_codes() const { return q8_; }
  const std::vector<float>& head_weights() const { return w_; }
  // Process CPU seconds (all threads) spent in forward() since construction (for `kestrel bench`;
  // exact with one thread, includes OpenMP spin time with more).
  double seconds() const { return seconds_; }

 private:
  DsaIndexerDims d_;
  kernels::WeightMatrix wq_b_, wk_, wproj_;
  std::vector<float> kn_w_, kn_b_;
  // Scratch (not reentrant).
  std::vector<float> q_, k_, w_;
  std::vector<uint8_t> q8_;
  double seconds_ = 0;
};

}  // namespace kestrel
