// Kimi K3 (hybrid KDA + gated MLA, Block AttnRes, LatentMoE) and Kimi Linear (KDA + MLA, plain
// residual, MoE) text models on CPU, built from layers/. Activations and math in fp32; weights stay
// in checkpoint format (bf16 / MXFP4) and are decoded inside the kernels.
// Thread-safety: forward() is not reentrant (one caller at a time); OpenMP parallelises inside.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "layers/ffn.h"
#include "layers/kda_layer.h"
#include "layers/mla_layer.h"
#include "layers/vision_projector.h"
#include "layers/vision_tower.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "models/model.h"

namespace kestrel {

class KimiModel final : public Model {
 public:
  // Loads config.json and binds every tensor strictly; unused checkpoint tensors are an error.
  // A path to a regular file is read as GGUF (llama.cpp's kimi-k3 / kimi-linear layout).
  // shard: a cell rank's experts (load_model()); null binds every expert.
  static Result<std::unique_ptr<KimiModel>> load(const std::string& dir, ExpertShard* shard = nullptr);
  static Result<std::unique_ptr<KimiModel>> load_gguf(const std::string& path);

  void forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits, const ForwardOptions& opt = {}) override;
  double indexer_seconds() const override;
  std::span<const int32_t> last_topk(size_t layer) const override;
  bool has_vision() const override { return vision_tower_ != nullptr; }
  Result<std::vector<float>> encode_images(std::span<const VisionImage> images, const StopFn& stop = {},
                                           VisionStageTimes* times = nullptr) const override;

 private:
  struct Layer {
    std::vector<float> in_norm, post_norm;
    std::vector<float> attn_res_c, mlp_res_c;  // res_norm ⊙ res_proj (K3)
    std::unique_ptr<KdaLayer> kda;
    std::unique_ptr<MlaLayer> mla;
    std::unique_ptr<GatedMlp> dense;
    std::unique_ptr<MoeBlock> moe;
  };
  Status bind(Binder& b);
  Status bind_checkpoint(Binder& b, const std::string& dir);  // bind, then the K3 vision tower and projector
  void run_attn(size_t l, const float* x, int64_t T, float* out, const ForwardOptions& o);
  void run_ffn(size_t l, const float* x, int64_t T, float* out);
  void forward_k3(int64_t T, const ForwardOptions& o);
  void forward_linear(int64_t T, const ForwardOptions& o);

  std::unique_ptr<Checkpoint> ckpt_;  // owns the mmaps every WeightMatrix points into
  std::unique_ptr<GgufWeights> gguf_;  // or this, for a model loaded from GGUF
  kernels::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_, out_res_c_;
  std::vector<Layer> layers_;
  std::unique_ptr<VisionTower> vision_tower_;  // K3 checkpoints with vision_tower.* tensors
  VisionProjector vision_projector_;
  // Scratch [T, hidden] buffers (not reentrant).
  std::vector<float> h_, normed_, sub_, mix_;
  std::vector<std::vector<float>> bank_;
  std::vector<const float*> rows_;
  std::vector<Segment<KdaState>> kda_segs_;
  std::vector<Segment<MlaCache>> mla_segs_;
  std::span<const SeqRun> runs_;  // the batch being run (valid during forward_batch)
};

}  // namespace kestrel
