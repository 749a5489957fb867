// Grouped-query-attention MoE text models on CPU, built from layers/: every layer is grouped-query attention
// (layers/gqa_layer.h) followed by a softmax top-k MoE without shared experts (or a dense SwiGLU MLP where the
// config asks for one); plain pre-norm residual. Weights stay in checkpoint format and are decoded inside the
// kernels; math in fp32. Two families (docs/model-math.md):
//   Qwen3-MoE (qwen3_moe, Qwen3MoeForCausalLM; §11): q/k RMSNorm, plain RoPE; safetensors or a `qwen3moe` GGUF;
//   gpt-oss (gpt_oss, GptOssForCausalLM; §12): q/k/v/o biases, sinks, alternating sliding window, YaRN, biased
//   router and experts with the clamped SwiGLU; a `gpt-oss` GGUF (its safetensors fuse gate/up per layer and are
//   refused with a message).
// GGUF files: llama.cpp's converter; loader/gguf_config.h maps the metadata, layers/gguf_weights.h the tensor
// names; the same layers, weights used in place from the mmap.
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

class GqaMoeModel final : public Model {
 public:
  // `dir` is a checkpoint directory or a `qwen3moe` / `gpt-oss` GGUF file.
  static Result<std::unique_ptr<GqaMoeModel>> load(const std::string& dir, ExpertShard* shard = nullptr);
  static Result<std::unique_ptr<GqaMoeModel>> load_gguf(const std::string& path);
  void forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits, const ForwardOptions& opt = {}) override;

 private:
  struct Layer {
    std::vector<float> in_norm, post_norm;
    GqaLayer attn;
    std::unique_ptr<GatedMlp> dense;
    std::unique_ptr<MoeBlock> moe;
  };
  GqaMoeModel() = default;
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
