// Gated NoPE MLA layer (kimi_k3_spec.md §4.4, kda_kimi_linear.md §4). The 64 "rope" dims are kept
// but never rotated; softmax scale 1/sqrt(qk_nope + qk_rope); optional per-channel sigmoid output
// gate from the layer input (K3). Cache per token: [c_kv normed (kv_lora) | k_r (rope)].
#pragma once

#include <string>
#include <vector>

#include "layers/binder.h"
#include "loader/model_config.h"

namespace kestrel {

// Per-sequence latent cache for one MLA layer (contiguous; paging lives in cache/).
struct MlaCache {
  std::vector<float> latent;  // [n_tokens, kv_lora + rope]
  int64_t n_tokens = 0;
  void reset() { latent.clear(), n_tokens = 0; }
};

enum class MlaMode { kAuto, kExpanded, kAbsorbed };

class MlaLayer {
 public:
  Status bind(Binder& b, const std::string& prefix, const TextConfig& c);
  // x: [T, hidden] (input-normed); appends T tokens to the cache; out: [T, hidden].
  void forward(const float* x, int64_t T, MlaCache& cache, float* out, MlaMode mode = MlaMode::kAuto);

 private:
  void attend_expanded(int64_t T, const MlaCache& cache);
  void attend_absorbed(int64_t T, const MlaCache& cache);

  const TextConfig* c_ = nullptr;
  int64_t nh_ = 0, dn_ = 0, dr_ = 0, dv_ = 0, lora_ = 0, qk_ = 0;
  kernels::WeightMatrix wq_, wqa_, wqb_, wkva_, wkvb_, wg_, wo_;
  std::vector<float> q_norm_, kv_norm_;
  // Scratch (not reentrant).
  std::vector<float> qa_, q_, ckv_, kv_, k_, v_, attn_, qlat_, olat_, wblk_, gate_;
};

}  // namespace kestrel
