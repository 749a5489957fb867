#include "kernels/cpu/elementwise.h"

#include <cmath>

namespace kestrel::kernels {

// Row- and element-parallel only when the work is large enough to beat the fork/join cost.
constexpr int64_t kParallelMin = 1 << 14;

void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    if (w != nullptr)
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
    else
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
  }
}

void l2_norm(float* x, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + eps);
    for (int64_t i = 0; i < n; ++i) xr[i] *= inv;
  }
}

void swiglu(const float* g, const float* u, int64_t count, float* out) {
#pragma omp parallel for schedule(static) if (count >= kParallelMin)
  for (int64_t i = 0; i < count; ++i) out[i] = silu(g[i]) * u[i];
}

void situ_glu(const float* g, const float* u, int64_t count, float beta, float beta_lin, float* out) {
#pragma omp parallel for schedule(static) if (count >= kParallelMin)
  for (int64_t i = 0; i < count; ++i) {
    const float a = beta * std::tanh(g[i] / beta) * sigmoid(g[i]);
    const float b = beta_lin * std::tanh(u[i] / beta_lin);
    out[i] = a * b;
  }
}

}  // namespace kestrel::kernels
