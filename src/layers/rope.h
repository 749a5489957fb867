// Decoupled RoPE of DeepSeek MLA (docs/model-math.md §5.4): the qk_rope_head_dim slice of every
// query head and the shared k_pe are rotated in ADJACENT pairs (x[2i], x[2i+1]) by angle
// pos · inv_freq[i] (GPT-J / "interleaved" layout, as DeepSeek's HF weights are stored), with
// optional YaRN frequency blending and cos/sin magnitude. The table is built in fp32 in the same
// order of operations as transformers' _compute_yarn_parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "loader/model_config.h"

namespace kestrel {

class MlaRope {
 public:
  MlaRope() = default;
  MlaRope(const MlaRopeConfig& c, int64_t dim);
  int64_t pairs() const { return static_cast<int64_t>(inv_freq_.size()); }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float magnitude() const { return mag_; }
  // cos / sin (each [pairs]) for one absolute position, magnitude folded in.
  void angles(int64_t pos, float* cos, float* sin) const;
  // x[2i], x[2i+1] ← rotation by (cos[i], sin[i]), i < pairs. In place.
  void rotate(float* x, const float* cos, const float* sin) const;

 private:
  std::vector<float> inv_freq_;
  float mag_ = 1.0f;
};

}  // namespace kestrel
