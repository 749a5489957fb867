// Kimi Delta Attention core (fp32), one sequence, all heads. Inputs are already projected, conv'd,
// L2-normalised (q, k) and gated; see docs/model-math.md §3.4-3.6.
//
// Shapes (row-major, contiguous):
//   q, k   [T, H, K]     (L2-normalised per head; `scale` is applied to q inside)
//   v      [T, H, V]
//   g      [T, H, K]     log-space decay (<= 0), per head and key channel
//   beta   [T, H]
//   state  [H, K, V]     fp32 recurrent state S_h (key-major), read as the initial state and
//                        overwritten with the final state
//   out    [T, H, V]
// Recurrence per token: S <- diag(exp(g_t)) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;
//                       o_t = S^T (scale q_t).
#pragma once

#include <cstdint>
#include <span>

namespace kestrel::kernels {

struct KdaArgs {
  int64_t T = 0, H = 0, K = 128, V = 128;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  float scale = 0.0f;
  float* state = nullptr;
  float* out = nullptr;
};

// Token-by-token recurrence (decode, and the scalar reference for the chunked form).
void kda_recurrent(const KdaArgs& a);
// Several independent recurrences (one per sequence of a decode batch) in one parallel region.
void kda_recurrent_many(std::span<const KdaArgs> args);

// Chunked (WY/UT) form with chunk size `chunk` (64 in production); exact for any T (tail chunk is
// handled without padding artefacts). Numerically safe for strongly negative g: only exp of
// non-positive differences is formed.
void kda_chunked(const KdaArgs& a, int64_t chunk = 64);

}  // namespace kestrel::kernels
