// Our W4A8 format, both halves:
//
// Weights: compressed-tensors "pack-quantized" int4, symmetric, one bf16 scale per `group` inputs
// (group 32, 64 or 128), exactly as compressed-tensors' pack_to_int32 / vLLM lay it out:
//   weight_packed I32 [out, in/8]: element k of a row sits at bits 4·(k%8) of word k/8, stored as
//                                  q + 8 (q ∈ [-8, 7]); little-endian, so byte j holds elements 2j
//                                  (low nibble) and 2j+1 (high nibble), the same as MXFP4's bytes.
//   weight_scale  BF16 [out, in/group]; w ≈ q · scale.
//   weight_shape  I64 [2] = {out, in}.
// Quantization follows compressed-tensors' own minmax observer + quantize() on bf16 weights:
// scale = bf16(absmax / 7.5) (0 → bf16 eps 2^-7), q = clamp(round_half_even(bf16(w / scale)), -8, 7).
// The intermediate bf16 rounding of w / scale is theirs (torch divides bf16 tensors in bf16); we
// keep it so our files are bit-identical to what llm-compressor would write for the same weights.
//
// Activations: int8, symmetric, one fp32 scale per token (dynamic, computed at run time):
// s = absmax / 127, q = clamp(round_half_even(x · (127 / absmax)), -127, 127) (all-zero rows: s = 0).
// Per token rather than per 32-block: it is what the checkpoint's quantization_config declares
// ("input_activations": {"strategy": "token", "dynamic": true}), so vLLM computes the same thing,
// and the inner loop then needs only the weight group scale (one fp32 multiply per group).
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel::kernels {

// One row: w [in] (bf16 values held in fp32) → packed [in/8] words, scales [in/group] bf16 bits.
// Requires in % group == 0 and group % 8 == 0.
void quantize_int4_row(const float* w, int64_t in, int64_t group, uint32_t* packed, uint16_t* scales);

// q ∈ [-8, 7] of element k from the packed bytes of one row.
inline int int4_at(const uint8_t* row_bytes, int64_t k) {
  return ((row_bytes[k >> 1] >> ((k & 1) * 4)) & 15) - 8;
}

// Exact fp32 dequantization of one row: dst[k] = q_k · scale (a 4-bit × 8-bit product, no rounding).
void dequantize_int4_row(const uint8_t* row_bytes, const uint16_t* scales, int64_t in, int64_t group, float* dst);

// Activations of T tokens quantized to int8, in two layouts:
//   q   [T, in]           natural order (scalar path, AMX packing);
//   qp  [T, in]           SIMD order: each full 128-element chunk as [64 even elements, 64 odd
//                         elements], the remaining 32-element chunks as [16 even, 16 odd]. A byte's
//                         low nibbles then line up with the even half and high nibbles with the odd
//                         half, so the packed weights are used without any shuffle;
//   wsum [T, in/8]        Σ q over each 8-element word (the u8-offset compensation);
//   scale [T]             fp32 per-token scale.
// Buffers only grow (steady-state decode allocates nothing). Requires in % 32 == 0.
struct QuantizedActs {
  int64_t T = 0, in = 0;
  std::vector<int8_t> q, qp;
  std::vector<int32_t> wsum;
  std::vector<float> scale;
};

void quantize_activations(const float* x, int64_t T, int64_t in, QuantizedActs& out);

// Position of element k (0 ≤ k < in) inside a token's `qp` row.
int64_t simd_order_index(int64_t k, int64_t in);

}  // namespace kestrel::kernels
