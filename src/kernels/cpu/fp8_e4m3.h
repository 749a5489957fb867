// OCP e4m3fn (FP8) conversions shared by the DSA indexer's key cache and the fp8 MLA latent cache:
// the scalar encoder, DeepSeek's act_quant block quantizer, and the decoders (table and vectorizable).
#pragma once

#include <cstdint>

namespace kestrel::kernels {

// One FP8 block exactly as DeepSeek's act_quant: amax = max(max|x|, 1e-4); scale = amax / 448, or
// with ue8m0 the power of two 2^ceil(log2(amax / 448)); codes = e4m3fn(clamp(x / scale, ±448)) with
// round-to-nearest-even. Returns the scale.
float quantize_e4m3_block(const float* x, int64_t n, bool ue8m0, uint8_t* codes);

// fp32 → OCP e4m3fn code, round-to-nearest-even, |x| saturated at 448.
uint8_t f32_to_e4m3(float x);
// The 256 e4m3fn code values as fp32 (NaN codes → NaN).
const float* e4m3_table();

// e4m3fn codes → fp32, branch-free so it vectorizes (NaN codes are never produced by the quantizer
// and decode as ±480 here; e4m3_table() keeps them NaN).
void decode_e4m3(const uint8_t* __restrict in, float* __restrict out, int64_t n);

}  // namespace kestrel::kernels
