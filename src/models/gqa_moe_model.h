// Qwen3-MoE (model_type qwen3_moe, Qwen3MoeForCausalLM) text model on CPU (docs/model-math.md §11), built from
// layers/: every layer is grouped-query attention (layers/gqa_layer.h) followed by a softmax top-k MoE without
// shared experts (or a dense SwiGLU MLP where the config asks for one); plain pre-norm residual. Weights stay in
// checkpoint format and are decoded inside the kernels; math in fp32.
//
// Also loads a `qwen3moe` GGUF file (llama.cpp's converter; loader/gguf_config.h maps the metadata,
// layers/gguf_weights.h the tensor names): the same layers, weights used in place from the mmap.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "layers/ffn.h"
#include "layers/gguf_weights.h"
#include "layers/gqa_layer.h"
#include "loader/checkpoint.h"
#include "models/model.h"

namespace kestrel {

class Qwen3MoeModel final : public Model {
 public:
  // `dir` is a checkpoint directory or a `qwen3moe` GGUF file.
  static Result<std::unique_ptr<Qwen3MoeModel>> load(const std::string& dir, ExpertShard* shard = nullptr);
  static Result<std::unique_ptr<Qwen3MoeModel>> load_gguf(const std::string& path);
  void forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits, const ForwardOptions& opt = {}) override;

 private:
  struct Layer {
    std::vector<float> in_norm, post_norm;
    GqaLayer attn;
    std::unique_ptr<GatedMlp> dense;
    std::unique_ptr<MoeBlock> moe;
  };
  Qwen3MoeModel() = default;
  Status bind(Binder& b);

  std::unique_ptr<Checkpoint> ckpt_;   // owns the mmaps every WeightMatrix points into
  std::unique_ptr<GgufWeights> gguf_;  // or this, for a model loaded from GGUF
  kernels::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  // Scratch (not reentrant).
  std::vector<float> h_, normed_, sub_;
  std::vector<Segment<MlaCache>> segs_;
};

}  // namespace kestrel
