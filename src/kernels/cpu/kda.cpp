// Kimi Delta Attention core, fp32 CPU kernels: the token recurrence (decode, and the reference for the chunked
// form in kda_chunked.cpp). Math: docs/model-math.md §3.5 (recurrence order).
#include "kernels/cpu/kda.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kestrel::kernels {
namespace {

// One head of the recurrence over a.T tokens; p [V] and decay [K] are scratch.
void recurrent_head(const KdaArgs& a, int64_t h, float* pv, float* decay) {
  const int64_t T = a.T, H = a.H, K = a.K, V = a.V;
  float* S = a.state + h * K * V;
  for (int64_t t = 0; t < T; ++t) {
    const float* q = a.q + (t * H + h) * K;
    const float* k = a.k + (t * H + h) * K;
    const float* v = a.v + (t * H + h) * V;
    const float* g = a.g + (t * H + h) * K;
    const float b = a.beta[t * H + h];
    float* o = a.out + (t * H + h) * V;
    for (int64_t d = 0; d < K; ++d) decay[d] = std::exp(g[d]);
    // S ← diag(exp(g)) S;  p = Sᵀ k (from the decayed state).
    std::fill(pv, pv + V, 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * V;
      const float f = decay[d];
      const float kd = k[d];
#pragma omp simd
      for (int64_t x = 0; x < V; ++x) {
        Sd[x] *= f;
        pv[x] += kd * Sd[x];
      }
    }
    // u = β (v − p);  S ← S + k uᵀ;  o = Sᵀ (scale q) read after the update.
    for (int64_t x = 0; x < V; ++x) pv[x] = b * (v[x] - pv[x]);
    std::fill(o, o + V, 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * V;
      const float kd = k[d];
      const float qd = q[d] * a.scale;
#pragma omp simd
      for (int64_t x = 0; x < V; ++x) {
        Sd[x] += kd * pv[x];
        o[x] += qd * Sd[x];
      }
    }
  }
}

}  // namespace

void kda_recurrent_many(std::span<const KdaArgs> args) {
  int64_t total = 0;
  for (const KdaArgs& a : args) total += a.H;
  // (sequence, head) pairs in one parallel region: a decode step of B sequences forks once.
  int64_t maxK = 1, maxV = 1;
  for (const KdaArgs& a : args) maxK = std::max(maxK, a.K), maxV = std::max(maxV, a.V);
  parallel_for(0, total, 1, true, [&](int64_t i) {
    float* p = thread_scratch(kScratchKdaP, static_cast<size_t>(maxV));
    float* decay = thread_scratch(kScratchKdaDecay, static_cast<size_t>(maxK));
    size_t s = 0;
    int64_t h = i;
    while (h >= args[s].H) h -= args[s++].H;
    recurrent_head(args[s], h, p, decay);
  });
}

void kda_recurrent(const KdaArgs& a) { kda_recurrent_many(std::span<const KdaArgs>(&a, 1)); }

}  // namespace kestrel::kernels
