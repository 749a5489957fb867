// Internal to kernels/cpu: the per-ISA int8-activation kernels behind w4a8_gemm.cpp's dispatcher.
// Each computes y rows [r0, r1) for every token of `acts`; callers split rows across threads.
//
// Arithmetic (every path): weights are used as unsigned bytes u = v + c (int4: the stored nibble,
// c = 8; MXFP4: 2·E2M1 + 12 from a 16-entry table, c = 12), so u8 × s8 instructions (vpdpbusd,
// vpmaddubsw, tdpbusd) apply directly and Σ v·x = Σ u·x − c·Σ x is exact in int32.
// Per scale group g (int4: `group` inputs; MXFP4: 32): acc += float(Σ_g v·x) · scale_g, then
// y = acc · x_scale. The int32 group sums are exact on every path; only the fp32 order differs
// (SIMD paths sum per-8-element lanes, then across lanes).
#pragma once

#include <cstdint>

#include "kernels/cpu/w4a8_format.h"

namespace kestrel::kernels {

enum class Int8Weights { kInt4, kMxfp4 };

struct Int8GemmTask {
  Int8Weights kind = Int8Weights::kInt4;
  const uint8_t* packed = nullptr;  // [out, in/2] bytes (element 2j low nibble of byte j)
  const uint8_t* scales = nullptr;  // int4: bf16 [out, in/group]; MXFP4: E8M0 [out, in/32]
  int64_t out = 0, in = 0, group = 32;
  const QuantizedActs* acts = nullptr;
  float* y = nullptr;  // [T, ldy], columns [0, out) written
  int64_t ldy = 0;
};

// The small-T kernels read R rows at a time, each two streams (packed codes, scales), and a thread's
// register blocks follow each other in memory (the next block's rows start block_bytes further on in
// each stream). Paired with a load at p: a prefetch of the same point one block ahead into L1 and two
// blocks ahead into L2, as the GGUF kernels do (gguf_blocks::prefetch_chunk_ahead; docs/PERFORMANCE.md,
// "Decode prefetch"). The callers issue one per cache line of codes and one where scales cross a line.
__attribute__((always_inline)) inline void int8_prefetch_ahead(const uint8_t* p, int64_t block_bytes) {
  __builtin_prefetch(p + block_bytes, 0, 3);
  __builtin_prefetch(p + 2 * block_bytes, 0, 2);
}

// 2·E2M1 value of an MXFP4 code (small integers: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12).
inline constexpr int8_t kMxfp4Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void int8_rows_scalar(const Int8GemmTask& t, int64_t r0, int64_t r1);
void int8_rows_avx2(const Int8GemmTask& t, int64_t r0, int64_t r1);
void int8_rows_avx512(const Int8GemmTask& t, int64_t r0, int64_t r1);
// Its prefill (convert-then-GEMM) form, w4a8_prefill_avx512.cpp: the same bits for every token;
// requires in % 128 == 0.
void int8_gemm_rows_avx512(const Int8GemmTask& t, int64_t r0, int64_t r1);
// AMX tiles; r1 - r0 ≤ 16.
void int8_rows_amx(const Int8GemmTask& t, int64_t r0, int64_t r1);
// The same AMX kernel with the tile unit emulated in C++ (tests only: checks the AMX data layout
// and group bookkeeping on CPUs without AMX). r1 - r0 ≤ 16.
void int8_rows_amx_emulated(const Int8GemmTask& t, int64_t r0, int64_t r1);

}  // namespace kestrel::kernels
