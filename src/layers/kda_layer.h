// Kimi Delta Attention layer (docs/model-math.md §2.2, §3).
// Both gate forms (bounded sigmoid with gate_lower_bound; -exp(A_log)·softplus) and both output
// gates (full-rank g_proj; low-rank g_a/g_b) are typed config choices.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/kda.h"
#include "layers/binder.h"
#include "loader/model_config.h"

namespace kestrel {

// Per-sequence KDA state for one layer: a VIEW into storage owned by a SequenceState or a slot pool.
struct KdaState {
  float* conv = nullptr;       // [3 (q,k,v), W-1, P]: last W-1 pre-conv inputs, oldest first
  float* recurrent = nullptr;  // [H, K, V] fp32
  static int64_t conv_floats(const TextConfig& c);
  static int64_t recurrent_floats(const TextConfig& c);
  void zero(const TextConfig& c) const;
};

// A contiguous run of tokens of one sequence inside a batch [T_total, hidden].
template <typename State>
struct Segment {
  int64_t offset = 0;  // first token row in the batch
  int64_t T = 0;
  State* state = nullptr;
};

class KdaLayer {
 public:
  Status bind(Binder& b, const std::string& prefix, const TextConfig& c);
  // x: [T_total, hidden] (input-normed) holding every segment's tokens; out: [T_total, hidden].
  // Projections run once over the whole batch; conv and recurrence per segment with its own state.
  void forward(const float* x, int64_t T_total, std::span<const Segment<KdaState>> segs, float* out,
               bool force_recurrent = false);

 private:
  void short_conv(const float* in, int64_t T, int which, float* conv_state, float* out);

  const TextConfig* c_ = nullptr;
  int64_t H_ = 0, D_ = 0, P_ = 0, W_ = 0;
  kernels::WeightMatrix wq_, wk_, wv_, wfa_, wfb_, wb_, wg_, wga_, wgb_, wo_;
  std::vector<float> conv_w_[3];  // [W, P] (transposed from the checkpoint's [P, 1, W]: vectorizes over channels)
  std::vector<float> a_exp_;      // exp(A_log[h]) for h < H
  std::vector<float> dt_bias_;    // [P]
  std::vector<float> o_norm_;     // [D]
  // A call's temporaries, shared by the KDA layers of the calling thread (layers/shared_temps.h).
  struct Temps {
    std::vector<float> proj[3], act[3], conv_next, f_low, f, beta, gate_low, gate, o;
    std::vector<kernels::KdaArgs> rec;
  };
};

}  // namespace kestrel
