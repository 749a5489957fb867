// What the GGUF int8 kernels for Q8_0 and MXFP4 (gguf_int8_avx512.cpp, gguf_int8_avx2.cpp and their GEMM
// forms) share about the block layouts and the activations of gguf_int8.h: the formats, their block sizes
// and code offsets, and where each token's quantized row starts. (Q4_0 runs on its packed rows,
// gguf_q4_x16.h.)
#pragma once

#include <cstdint>

#include "kernels/cpu/gguf_int8.h"

namespace kestrel::kernels::gguf_blocks {

enum class Kind { kQ8_0, kMxfp4 };

// Bytes of one 32-element block, and where its codes start (after the fp16 / E8M0 scale).
template <Kind K>
constexpr int64_t kBlockBytes = K == Kind::kQ8_0 ? 34 : 17;
template <Kind K>
constexpr int64_t kCodeOffset = K == Kind::kMxfp4 ? 1 : 2;

// Software prefetch of one 4-block chunk (136 / 68 bytes) starting at p: one prefetch per 64 bytes
// from its start. Over consecutive chunks the points are at most 64 bytes apart, so every cache line of
// a row gets one. Locality 3 fetches into L1 (prefetcht0), 2 into L2 (prefetcht1).
template <Kind K, int Locality = 3>
__attribute__((always_inline)) inline void prefetch_chunk(const uint8_t* p) {
#pragma GCC unroll 4
  for (int64_t o = 0; o < 4 * kBlockBytes<K>; o += 64) __builtin_prefetch(p + o, 0, Locality);
}

// The small-T kernels read R rows at a time, each a separate stream, and a thread's register blocks
// follow each other in memory (the next block's rows start block_bytes = R · row bytes further on).
// Each chunk load is paired with prefetches of the same chunk one block ahead (into L1) and two blocks
// ahead (into L2): they follow the read pattern at any row length and keep more lines in flight than
// the hardware prefetchers do for R streams (measurements: docs/PERFORMANCE.md, "Decode prefetch").
template <Kind K>
__attribute__((always_inline)) inline void prefetch_chunk_ahead(const uint8_t* chunk, int64_t block_bytes) {
  prefetch_chunk<K, 3>(chunk + block_bytes);
  prefetch_chunk<K, 2>(chunk + 2 * block_bytes);
}

// Token pointers into the activations for output tokens t0..t0+U−1: activation token tok[t0 + u], or
// t0 + u itself when tok is null. Q8_0 weights read the natural order (q), MXFP4 the nibble order (qg).
template <Kind K, int U>
inline void token_ptrs(const Q8Acts& a, const int32_t* tok, int64_t t0, const int8_t* (&X)[U], const int32_t* (&C)[U],
                       const float* (&D)[U]) {
  const int64_t P = a.nc * 128;
  for (int u = 0; u < U; ++u) {
    const int64_t t = tok ? tok[t0 + u] : t0 + u;
    X[u] = (K == Kind::kQ8_0 ? a.q.data() : a.qg.data()) + t * P;
    C[u] = a.comp.data() + t * (P / 8);
    D[u] = a.d.data() + t * (P / 32);
  }
}

}  // namespace kestrel::kernels::gguf_blocks
