// Linear layers y = x W^T with weights kept in their checkpoint format (no fp32 copy).
//   W: [out, in] row-major, dtype F32 / BF16 / F16, or MXFP4 (compressed-tensors packing:
//      packed U8 [out, in/2], byte j = code(2j) | code(2j+1) << 4; scales E8M0 U8 [out, in/32]),
//      or FP8 E4M3 with one fp32 scale_inv per 128×128 block (DeepSeek; see linear_fp8.h).
//      GGUF block formats (kGgufQ8_0 / kGgufQ4_0 / kGgufMxfp4): `data` is the row-major ggml block
//      stream, in/32 blocks per row, used in place (see linear_gguf.h); `scales` unused.
//   kW4A8: int4 pack-quantized (compressed-tensors): packed I32 [out, in/8] (element k at bit 4·(k%8)
//      of word k/8, stored as q+8), scales BF16 [out, in/group]; matmul quantizes x to int8 per token
//      (kernels/cpu/w4a8_gemm.h).
//   x: [T, in] fp32, y: [T, out] fp32. Accumulation fp32.
// Thread-safety: pure functions; parallel over output rows with OpenMP.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/dtype.h"

namespace kestrel::kernels {

enum class WeightFormat { kF32, kBF16, kF16, kMxfp4, kFp8Block, kGgufQ8_0, kGgufQ4_0, kGgufMxfp4, kW4A8 };

struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t out = 0, in = 0;
  const void* data = nullptr;          // values or packed codes
  // MXFP4: E8M0 bytes [out, in/32]. FP8 block: the bytes of fp32 scale_inv [ceil(out/128), ceil(in/128)].
  // W4A8: bf16 values [out, in/group] (2-byte aligned).
  const uint8_t* scales = nullptr;
  int64_t group = 0;  // W4A8 only: elements per scale (32, 64 or 128)
  // BF16 only: the activations may be rounded to bf16 for this matrix (GGUF files: what llama.cpp
  // computes; bf16_dot.h). Safetensors weights leave it false (exact fp32 activations).
  bool act_bf16 = false;
  // GGUF Q4_0 and MXFP4 only: the rows repacked in groups of 16 (gguf_q4_x16.h), which the int8 products
  // read; data keeps the ggml rows (the exact fp32 path decodes those). Without it Q4_0 products take the
  // exact path and MXFP4 products the in-place int8 kernels (gguf_int8.h).
  const uint8_t* packed = nullptr;
};

// Decodes row r of W into fp32 (length in).
void decode_row(const WeightMatrix& w, int64_t r, float* dst);

// y[T, out] = x[T, in] W^T.
void matmul(const WeightMatrix& w, const float* x, int64_t T, float* y);

// One product of a batch run by matmul_many: y[T, ldy] (columns [0, w.out) written) = x[T, w.in] W^T.
struct MatmulTask {
  const WeightMatrix* w = nullptr;
  const float* x = nullptr;
  int64_t T = 0;
  float* y = nullptr;
  int64_t ldy = 0;  // 0: w.out
};

// Runs every task in ONE parallel region (one fork/join instead of one per product): the row blocks
// of all tasks are cut into chunks of similar cost and handed to the threads. Used to batch the
// products that share an input (q/k/v projections, gate/up) and all routed experts of a MoE layer.
// Each output element is computed by one thread in a fixed order, so results do not depend on the
// thread count, on T, or on which other tasks run alongside (batch invariance).
void matmul_many(std::span<const MatmulTask> tasks);

// Serial kernel: rows [r0, r1) of y for all T tokens (what matmul and matmul_many run per chunk).
void matmul_rows(const WeightMatrix& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1);

// Scalar reference used by tests (decodes every row, plain double-free fp32 loops).
void matmul_reference(const WeightMatrix& w, const float* x, int64_t T, float* y);

}  // namespace kestrel::kernels
