// BF16 weights × BF16-rounded activations (AVX-512 BF16 vdpbf16ps), the way llama.cpp's CPU backend
// runs BF16 matrices: each activation row is rounded to bf16 (round to nearest even) once, and each
// output is a sum of exact bf16×bf16 products accumulated in fp32, two per lane per instruction.
// Used for GGUF BF16 weights in the default GGUF mode (set_gguf_int8 / KESTREL_GGUF_INT8: the same
// switch as the int8 path, "compute GGUF files the way llama.cpp does"); safetensors BF16 and the
// exact mode keep fp32 activations. Per (row, token) the operations and their order do not depend on
// T or on the row split: a token's result is the same alone or in any batch.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/linear.h"

namespace kestrel::kernels {

// Activations of T tokens rounded to bf16, rows padded to a multiple of 32 elements with zeros.
struct Bf16Acts {
  int64_t T = 0, in = 0, stride = 0;
  std::vector<uint16_t> x;
};
void bf16_acts_prepare(Bf16Acts& a, int64_t T, int64_t in);
void bf16_acts_fill(const float* x, int64_t t0, int64_t t1, Bf16Acts& a);

// Safetensors BF16 weights opt in with KESTREL_BF16_ACTS=1 (read once) or set_bf16_acts(true)
// (`--kernels fast`): faster batched decode and prefill at llama.cpp's / vLLM's CPU rounding instead
// of exact fp32 activations. Read when a model binds its weights, so set it before loading.
bool bf16_acts_opt_in();
void set_bf16_acts(bool on);
// Whether matmul runs `w` on this path (BF16, flagged act_bf16, GGUF mode on, CPU with AVX512-BF16).
bool bf16_dot_applies(const WeightMatrix& w);
bool cpu_has_avx512bf16();

// y[t, r] for r in [r0, r1), every token of `a` (row stride ldy). Serial; callers split rows.
void bf16_dot_rows(const WeightMatrix& w, const Bf16Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Scalar model of the same arithmetic (lane l of a 16-lane accumulator takes pairs 16k + l, odd
// element first, exact products, fp32 adds; lanes then summed pairwise as the kernel does), for tests.
void bf16_dot_rows_reference(const WeightMatrix& w, const Bf16Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);

}  // namespace kestrel::kernels
