// MLA layer. Kimi (docs/model-math.md §2.3, §3.9): NoPE — the 64 "rope" dims are
// kept but never rotated; softmax scale 1/sqrt(qk_nope + qk_rope); optional per-channel sigmoid
// output gate from the layer input (K3). DeepSeek V3 / K2 (docs/model-math.md §5, config
// `mla_rope` set): q_pe and k_pe are rotated (interleaved pairs, YaRN) at the token's position
// before k_pe is cached; softmax scale = config mla_softmax_scale (YaRN mscale² folded in).
// Cache per token: [c_kv normed (kv_lora) | k_r (rope, post-RoPE)].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_row.h"
#include "layers/binder.h"
#include "layers/dsa_indexer.h"
#include "layers/kda_layer.h"
#include "layers/rope.h"
#include "loader/model_config.h"

namespace kestrel {

// Per-sequence latent cache for one MLA layer: a VIEW of fixed-size byte pages owned by a
// SequenceState or the paged pool (cache/). Token j's row [c_kv normed | k_r], stored in row.dtype
// (--kv-cache-dtype; kernels/cpu/kv_row.h), is at pages[j / page_tokens] + (j % page_tokens) · row.bytes().
// The owner sets `row` and guarantees pages cover every token before forward() appends.
// Sparse (DSA) layers also carry their indexer key cache view (empty for dense layers).
struct MlaCache {
  std::vector<uint8_t*> pages;
  IndexerCache indexer;
  kernels::KvRowFormat row;
  int64_t page_tokens = 0;
  int64_t n_tokens = 0;
  uint8_t* row_ptr(int64_t j) const { return pages[static_cast<size_t>(j / page_tokens)] + (j % page_tokens) * row.bytes(); }
  int64_t capacity() const { return static_cast<int64_t>(pages.size()) * page_tokens; }
};

enum class MlaMode { kAuto, kExpanded, kAbsorbed };

class MlaLayer {
 public:
  // sparse: bind `<prefix>indexer.*` and attend only to each query's top-k positions (DSA).
  Status bind(Binder& b, const std::string& prefix, const TextConfig& c, bool sparse = false);
  // x: [T_total, hidden] (input-normed); each segment appends its tokens to its cache and attends
  // over it; out: [T_total, hidden]. Projections run once over the batch.
  void forward(const float* x, int64_t T_total, std::span<const Segment<MlaCache>> segs, float* out,
               MlaMode mode = MlaMode::kAuto);
  int64_t row_floats() const { return lora_ + dr_; }
  bool sparse() const { return indexer_ != nullptr; }
  const DsaIndexer* indexer() const { return indexer_.get(); }
  // Sparse layers: the last forward()'s selection [T_total, topk] (positions ascending, −1 padded);
  // empty for dense layers. For tests comparing selections with a reference.
  std::span<const int32_t> last_topk() const { return indexer_ ? std::span<const int32_t>(idx_) : std::span<const int32_t>{}; }

 private:
  void attend_expanded(int64_t off, int64_t T, const MlaCache& cache);
  void reserve_expanded(int64_t L, int64_t keep);
  void attend_absorbed(int64_t T, std::span<const Segment<MlaCache>> segs);
  const float* head_rows(int64_t r0, int64_t n) const;
  bool native_absorbed() const;
  void float_head_views();
  void per_head_products(const std::vector<kernels::WeightMatrix>& w, const float* src, int64_t src_stride, int64_t in,
                         float* dst, int64_t dst_stride, int64_t out, std::span<const Segment<MlaCache>> segs);
  void absorb_q_native(std::span<const Segment<MlaCache>> segs);
  void expand_out_native(std::span<const Segment<MlaCache>> segs);
  void apply_rope(int64_t off, int64_t T, int64_t pos0, int64_t row);

  const TextConfig* c_ = nullptr;
  int64_t nh_ = 0, dn_ = 0, dr_ = 0, dv_ = 0, lora_ = 0, qk_ = 0;
  kernels::WeightMatrix wq_, wqa_, wqb_, wkva_, wkvb_, wg_, wo_;
  // GGUF files split kv_b (k_b transposed, v_b); when their format runs the int8 path the absorbed
  // form uses them in place per head (the products llama.cpp runs), else the merged fp32 kv_b.
  // Float kv_b (safetensors): the same per-head products, v_b in place and k_b transposed into kb_t_.
  std::vector<kernels::WeightMatrix> kb_heads_, vb_heads_;
  std::vector<uint8_t> kb_t_;
  std::vector<float> q_norm_, kv_norm_;
  bool has_rope_ = false;
  MlaRope rope_;
  float scale_ = 1.0f;
  std::unique_ptr<DsaIndexer> indexer_;
  std::vector<Segment<IndexerCache>> idx_segs_;
  std::vector<int32_t> idx_;
  // A call's temporaries, shared by the MLA layers of the calling thread (layers/shared_temps.h): q_a rows,
  // queries, latent rows, up-projected rows of a slice, attention output, latent queries / outputs (absorbed),
  // the output gate, RoPE tables, per-head gathered inputs / outputs, cache rows of a slice.
  struct Temps {
    std::vector<float> qa, q, ckv, kv, attn, qlat, olat, gate, cos, sin, hin, hout, row_buf;
  };
  std::vector<kernels::MatmulTask> head_tasks_;
  std::vector<Segment<MlaCache>> absorbed_;
  std::vector<kernels::AttentionArgs> attn_args_;
  // Expanded form, kept between calls: per-head keys (kt_, packed) and values (v_) of exp_rows_valid_ cached tokens, room for
  // exp_cap_, and the bytes of the cache rows they were up-projected from (attend_expanded).
  std::vector<float> kt_, v_;
  std::vector<uint8_t> exp_rows_;
  int64_t exp_rows_valid_ = 0, exp_cap_ = 0, exp_row_bytes_ = 0;
};

}  // namespace kestrel
