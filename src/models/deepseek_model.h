// DeepSeek V3 / Kimi K2 (model_type deepseek_v3, kimi_k2) and DeepSeek V3.2 (deepseek_v32) text
// models on CPU (docs/model-math.md §5, §7, §8), built from layers/: every layer is MLA with
// decoupled YaRN RoPE; the first first_k_dense_replace layers have a dense SwiGLU MLP, the rest a
// noaux_tc MoE (group-limited) with shared experts; plain pre-norm residual. Weights stay in
// checkpoint format (bf16 or FP8 128×128 blocks) and are decoded inside the kernels; math in fp32.
//
// V3.2: every layer's MLA carries a DSA lightning indexer (layers/dsa_indexer.h, RoPE = the model's
// YaRN table applied NeoX-style) and attends, in the absorbed form, only to each query's top-k
// positions (all causal positions while the context is ≤ index_topk). Indexer keys live in their own
// pages (MlaCache::indexer; CacheGeometry::sparse_layers = every layer), exactly as K3's sparse layers.
// MTP layers (num_nextn_predict_layers, stored after the main layers) are accepted and not run.
//
// Also loads a `deepseek2` GGUF file (llama.cpp's converter; loader/gguf_config.h maps the metadata,
// layers/gguf_weights.h the tensor names): the same layers, weights used in place from the mmap.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "layers/ffn.h"
#include "layers/gguf_weights.h"
#include "layers/mla_layer.h"
#include "loader/checkpoint.h"
#include "models/model.h"

namespace kestrel {

class DeepseekModel final : public Model {
 public:
  // `dir` is a checkpoint directory or a `deepseek2` GGUF file.
  static Result<std::unique_ptr<DeepseekModel>> load(const std::string& dir, ExpertShard* shard = nullptr);
  static Result<std::unique_ptr<DeepseekModel>> load_gguf(const std::string& path);
  void forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits, const ForwardOptions& opt = {}) override;
  double indexer_seconds() const override;
  std::span<const int32_t> last_topk(size_t layer) const override;

 private:
  struct Layer {
    std::vector<float> in_norm, post_norm;
    MlaLayer mla;  // sparse (with its indexer) on V3.2
    std::unique_ptr<GatedMlp> dense;
    std::unique_ptr<MoeBlock> moe;
  };
  DeepseekModel() = default;
  Status bind(Binder& b);
  Status skip_mtp_layers();

  std::unique_ptr<Checkpoint> ckpt_;   // owns the mmaps every WeightMatrix points into
  std::unique_ptr<GgufWeights> gguf_;  // or this, for a model loaded from GGUF
  kernels::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  // Scratch (not reentrant).
  std::vector<float> h_, normed_, sub_;
  std::vector<Segment<MlaCache>> mla_segs_;
};

}  // namespace kestrel
