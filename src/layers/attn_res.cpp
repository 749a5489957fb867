#include "layers/attn_res.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace kestrel {

void attn_res_mix(std::span<const float* const> rows, int64_t T, int64_t D, const float* c, float eps, float* out) {
  const size_t n = rows.size();
  kernels::parallel_for(0, T, 1, true, [&](int64_t t) {
    float s[64];
    float mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      const float* r = rows[j] + t * D;
      double ss = 0, dotc = 0;
      for (int64_t d = 0; d < D; ++d) {
        ss += static_cast<double>(r[d]) * r[d];
        dotc += static_cast<double>(c[d]) * r[d];
      }
      s[j] = static_cast<float>(dotc / std::sqrt(ss / static_cast<double>(D) + eps));
      mx = std::max(mx, s[j]);
    }
    float sum = 0;
    for (size_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    float* o = out + t * D;
    std::fill(o, o + D, 0.0f);
    for (size_t j = 0; j < n; ++j) {
      const float p = s[j] / sum;
      const float* r = rows[j] + t * D;
      for (int64_t d = 0; d < D; ++d) o[d] += p * r[d];
    }
  });
}

}  // namespace kestrel
