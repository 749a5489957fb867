// The Kimi K3 multimodal projector (PatchMergerMLPV2, docs/vision.md §5): merged patches [tokens, 4·hidden] →
// Linear → GELU (exact erf) → Linear → RMSNorm(projector_ln_eps) → [tokens, text hidden]. No pre-norm, no biases;
// weights `mm_projector.proj.0`, `mm_projector.proj.2`, `mm_projector.post_norm` bound in place.
#pragma once

#include <cstdint>
#include <vector>

#include "base/result.h"
#include "layers/binder.h"
#include "loader/vision_config.h"

namespace kestrel {

class VisionProjector {
 public:
  Status bind(Binder& b, const VisionConfig& v);
  // merged [T, in_width()] → out [T, out_width()] (resized).
  void forward(const float* merged, int64_t T, std::vector<float>& out) const;
  int64_t in_width() const { return fc0_.in; }
  int64_t out_width() const { return fc2_.out; }

 private:
  kernels::WeightMatrix fc0_, fc2_;
  std::vector<float> post_norm_;
  float eps_ = 0;
};

}  // namespace kestrel
