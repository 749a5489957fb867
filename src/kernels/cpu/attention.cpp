#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kestrel::kernels {

void causal_attention(const AttentionArgs& a) {
  const int64_t offset = a.L - a.T;
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(a.L));
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < a.T; ++t) {
      for (int64_t h = 0; h < a.H; ++h) {
        const float* q = a.q + (t * a.H + h) * a.Dk;
        const int64_t n = offset + t + 1;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* k = a.k + j * a.k_token_stride + h * a.k_head_stride;
          float s = 0;
          for (int64_t d = 0; d < a.Dk; ++d) s += q[d] * k[d];
          s *= a.scale;
          p[static_cast<size_t>(j)] = s;
          mx = std::max(mx, s);
        }
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx);
          sum += p[static_cast<size_t>(j)];
        }
        const float inv = 1.0f / sum;
        float* o = a.out + (t * a.H + h) * a.Dv;
        std::fill(o, o + a.Dv, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float w = p[static_cast<size_t>(j)] * inv;
          const float* v = a.v + j * a.v_token_stride + h * a.v_head_stride;
          for (int64_t d = 0; d < a.Dv; ++d) o[d] += w * v[d];
        }
      }
    }
  }
}

}  // namespace kestrel::kernels
