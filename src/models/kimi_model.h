// Kimi K3 (hybrid KDA + gated MLA, Block AttnRes, LatentMoE) and Kimi Linear (KDA + MLA, plain
// residual, MoE) text models on CPU, built from layers/. Activations and math in fp32; weights stay
// in checkpoint format (bf16 / MXFP4) and are decoded inside the kernels.
// Thread-safety: forward() is not reentrant (one caller at a time); OpenMP parallelises inside.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "layers/ffn.h"
#include "layers/kda_layer.h"
#include "layers/mla_layer.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"

namespace kestrel {

// Everything one sequence carries between forward calls.
struct SequenceState {
  std::vector<KdaState> kda;  // indexed by layer (empty for MLA layers)
  std::vector<MlaCache> mla;  // indexed by layer (empty for KDA layers)
  int64_t n_tokens = 0;
};

struct ForwardOptions {
  bool all_logits = false;        // logits for every token (else only the last)
  MlaMode mla_mode = MlaMode::kAuto;
  bool kda_force_recurrent = false;
};

class KimiModel {
 public:
  // Loads config.json and binds every tensor strictly; unused checkpoint tensors are an error.
  static Result<std::unique_ptr<KimiModel>> load(const std::string& dir);

  const ModelConfig& config() const { return cfg_; }
  SequenceState new_sequence() const;
  // Reserves cache capacity for n_tokens in total so decode up to that length never allocates.
  void reserve(SequenceState& st, int64_t n_tokens) const;
  // Runs T tokens of one sequence; logits: [T or 1, vocab].
  void forward(const int32_t* ids, int64_t T, SequenceState& st, std::vector<float>& logits,
               const ForwardOptions& opt = {});

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
  void run_attn(size_t l, const float* x, int64_t T, SequenceState& st, float* out, const ForwardOptions& o);
  void run_ffn(size_t l, const float* x, int64_t T, float* out);
  void forward_k3(int64_t T, SequenceState& st, const ForwardOptions& o);
  void forward_linear(int64_t T, SequenceState& st, const ForwardOptions& o);

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;  // owns the mmaps every WeightMatrix points into
  kernels::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_, out_res_c_;
  std::vector<Layer> layers_;
  // Scratch [T, hidden] buffers (not reentrant).
  std::vector<float> h_, normed_, sub_, mix_;
  std::vector<std::vector<float>> bank_;
  std::vector<const float*> rows_;
};

}  // namespace kestrel
