// Small fp32 row ops: RMSNorm, activations, GLU variants. All shapes are [rows, n] contiguous.
#pragma once

#include <cstdint>

namespace kestrel::kernels {

// y = x * rsqrt(mean(x^2) + eps) * w   (w may be null → no weight). In-place allowed.
void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);

// x / sqrt(sum(x^2) + eps), per row of n (fla's l2norm). In-place allowed.
void l2_norm(float* x, int64_t rows, int64_t n, float eps);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float silu(float x) { return x * sigmoid(x); }

// Gated linear unit over separate gate and up arrays [rows, n] → out [rows, n].
//   SwiGLU: silu(g) * u
//   SiTU-GLU: beta*tanh(g/beta)*sigmoid(g) * beta_lin*tanh(u/beta_lin)   (docs/model-math.md §2.5)
void swiglu(const float* g, const float* u, int64_t count, float* out);
// x[i] = silu(x[i]) (serial; 16 lanes with glibc libmvec's expf when built with AVX-512).
void silu_inplace(float* x, int64_t n);
void situ_glu(const float* g, const float* u, int64_t count, float beta, float beta_lin, float* out);
// gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate, llama.cpp's swiglu_oai), elementwise in fp32:
// g' = min(g, limit), u' = clamp(u, −limit, limit), out = (g' / (1 + exp(alpha · −g'))) · (u' + 1) in that order
// (ggml's), serial (called on a work item's rows); out may alias g.
void swiglu_oai(const float* g, const float* u, int64_t count, float alpha, float limit, float* out);

// PyTorch's tanh-approximated GELU (`gelu_pytorch_tanh`) in place: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_tanh_inplace(float* x, int64_t n);

}  // namespace kestrel::kernels
