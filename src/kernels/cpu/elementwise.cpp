#include "kernels/cpu/elementwise.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace kestrel::kernels {

// Row- and element-parallel only when the work is large enough to beat the fork/join cost.
constexpr int64_t kParallelMin = 1 << 14;

void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  parallel_for(0, rows, 1, rows * n >= kParallelMin, [&](int64_t r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    if (w != nullptr)
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
    else
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
  });
}

void l2_norm(float* x, int64_t rows, int64_t n, float eps) {
  parallel_for(0, rows, 1, rows * n >= kParallelMin, [&](int64_t r) {
    float* xr = x + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + eps);
    for (int64_t i = 0; i < n; ++i) xr[i] *= inv;
  });
}

#if defined(__AVX512F__)
// glibc's libmvec (the vector math library GCC itself calls under -ffast-math): 16-lane expf / tanhf,
// ≤ 4 ulp by glibc's contract (SiTU measured against sglang's in tests/ops/layer_ops_test). Every
// element, a masked tail included, goes through the same 16-lane code: an element's result does not
// depend on its position, so a token's activations are the same alone or in any batch.
extern "C" __m512 _ZGVeN16v_expf(__m512);
extern "C" __m512 _ZGVeN16v_tanhf(__m512);

namespace {
inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
inline __m512 silu16(__m512 x) { return _mm512_mul_ps(x, sigmoid16(x)); }
inline __m512 situ16(__m512 g, __m512 u, __m512 beta, __m512 inv_beta, __m512 beta_lin, __m512 inv_beta_lin) {
  const __m512 a = _mm512_mul_ps(_mm512_mul_ps(beta, _ZGVeN16v_tanhf(_mm512_mul_ps(g, inv_beta))), sigmoid16(g));
  const __m512 b = _mm512_mul_ps(beta_lin, _ZGVeN16v_tanhf(_mm512_mul_ps(u, inv_beta_lin)));
  return _mm512_mul_ps(a, b);
}
inline __mmask16 lanes(int64_t i, int64_t count) { return static_cast<__mmask16>((1u << std::min<int64_t>(16, count - i)) - 1); }
}  // namespace

void swiglu(const float* g, const float* u, int64_t count, float* out) {
  parallel_for(0, count, 16, count >= kParallelMin, [&](int64_t i) {
    const __mmask16 m = lanes(i, count);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(m, g + i)), _mm512_maskz_loadu_ps(m, u + i)));
  });
}

void silu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(i, n);
    _mm512_mask_storeu_ps(x + i, m, silu16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void situ_glu(const float* g, const float* u, int64_t count, float beta, float beta_lin, float* out) {
  const __m512 vb = _mm512_set1_ps(beta), vib = _mm512_set1_ps(1.0f / beta);
  const __m512 vl = _mm512_set1_ps(beta_lin), vil = _mm512_set1_ps(1.0f / beta_lin);
  parallel_for(0, count, 16, count >= kParallelMin, [&](int64_t i) {
    const __mmask16 m = lanes(i, count);
    _mm512_mask_storeu_ps(out + i, m, situ16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), vb, vib, vl, vil));
  });
}

namespace {
// The constants of gelu_tanh_inplace: √(2/π) and 0.044715.
constexpr float kGeluBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kGeluKappa = 0.044715f;
}  // namespace

void gelu_tanh_inplace(float* x, int64_t n) {
  const __m512 beta = _mm512_set1_ps(kGeluBeta), kappa = _mm512_set1_ps(kGeluKappa), half = _mm512_set1_ps(0.5f),
               one = _mm512_set1_ps(1.0f);
  parallel_for(0, n, 4096, n >= kParallelMin, [&](int64_t i0) {
    const int64_t i1 = std::min(n, i0 + 4096);
    for (int64_t i = i0; i < i1; i += 16) {
      const __mmask16 m = lanes(i, i1);
      const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
      const __m512 inner = _mm512_mul_ps(beta, _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(kappa, v), v), v)));
      _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, _ZGVeN16v_tanhf(inner))));
    }
  });
}
#else
void swiglu(const float* g, const float* u, int64_t count, float* out) {
  parallel_for(0, count, 1, count >= kParallelMin, [&](int64_t i) { out[i] = silu(g[i]) * u[i]; });
}

void silu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = silu(x[i]);
}

void situ_glu(const float* g, const float* u, int64_t count, float beta, float beta_lin, float* out) {
  parallel_for(0, count, 1, count >= kParallelMin, [&](int64_t i) {
    const float a = beta * std::tanh(g[i] / beta) * sigmoid(g[i]);
    const float b = beta_lin * std::tanh(u[i] / beta_lin);
    out[i] = a * b;
  });
}

#if defined(__AVX2__) && defined(__FMA__)
extern "C" __m256 _ZGVdN8v_tanhf(__m256);

// The AVX-512 form's arithmetic on 8 lanes (libmvec's AVX2 tanhf); a tail of fewer than 8 goes through a padded
// copy.
void gelu_tanh_inplace(float* x, int64_t n) {
  const __m256 beta = _mm256_set1_ps(static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5)), kappa = _mm256_set1_ps(0.044715f),
               half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const auto gelu8 = [&](float* p) {
    const __m256 v = _mm256_loadu_ps(p);
    const __m256 inner = _mm256_mul_ps(beta, _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(kappa, v), v), v)));
    _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, _ZGVdN8v_tanhf(inner))));
  };
  parallel_for(0, n, 4096, n >= kParallelMin, [&](int64_t i0) {
    const int64_t i1 = std::min(n, i0 + 4096);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) gelu8(x + i);
    if (i < i1) {
      float tail[8] = {};
      std::copy(x + i, x + i1, tail);
      gelu8(tail);
      std::copy(tail, tail + (i1 - i), x + i);
    }
  });
}
#else
void gelu_tanh_inplace(float* x, int64_t n) {
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  parallel_for(0, n, 1, n >= kParallelMin, [&](int64_t i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(beta * (v + kappa * v * v * v)));
  });
}
#endif
#endif

void swiglu_oai(const float* g, const float* u, int64_t count, float alpha, float limit, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = std::min(g[i], limit), y = std::clamp(u[i], -limit, limit);
    out[i] = x / (1.0f + std::exp(alpha * -x)) * (y + 1.0f);
  }
}

}  // namespace kestrel::kernels
