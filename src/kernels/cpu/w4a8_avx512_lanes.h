// Internal to kernels/cpu: the per-chunk pieces of the AVX-512 VNNI int8-activation kernel shared by
// its small-T form (w4a8_avx512.cpp) and its prefill GEMM form (w4a8_prefill_avx512.cpp), so both
// build the same lane values. A 128-element chunk of a row is 64 packed bytes; lane i of
// dpbusd(lo, x_even) + dpbusd(hi, x_odd) is the sum over word i (elements 8i..8i+7).
// GCC 12 false positive in its AVX-512 headers (GCC PR105593): the includers silence it.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/w4a8_kernels.h"
#include "tensor/dtype.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma")))

namespace kestrel::kernels {
namespace w4a8_lanes {

template <Int8Weights K>
KESTREL_AVX512 inline void unpack(__m512i b, __m512i& lo, __m512i& hi) {
  const __m512i m = _mm512_set1_epi8(15);
  lo = _mm512_and_si512(b, m);
  hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m);
  if constexpr (K == Int8Weights::kMxfp4) {  // code → 2·E2M1 + 12 ∈ [0, 24]
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    lo = _mm512_shuffle_epi8(tbl, lo);
    hi = _mm512_shuffle_epi8(tbl, hi);
  }
}

template <Int8Weights K>
KESTREL_AVX512 inline __m128i unpack_lo128(__m128i b, __m128i& hi) {
  const __m128i m = _mm_set1_epi8(15);
  __m128i lo = _mm_and_si128(b, m);
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  if constexpr (K == Int8Weights::kMxfp4) {
    const __m128i tbl = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    lo = _mm_shuffle_epi8(tbl, lo);
    hi = _mm_shuffle_epi8(tbl, hi);
  }
  return lo;
}

// −c·Σx per word, c = 8 (int4) or 12 (MXFP4).
template <Int8Weights K>
KESTREL_AVX512 inline __m512i neg_comp(__m512i ws) {
  __m512i c = _mm512_slli_epi32(ws, 3);
  if constexpr (K == Int8Weights::kMxfp4) c = _mm512_add_epi32(c, _mm512_slli_epi32(ws, 2));
  return _mm512_sub_epi32(_mm512_setzero_si512(), c);
}
template <Int8Weights K>
KESTREL_AVX512 inline __m128i neg_comp128(__m128i ws) {
  __m128i c = _mm_slli_epi32(ws, 3);
  if constexpr (K == Int8Weights::kMxfp4) c = _mm_add_epi32(c, _mm_slli_epi32(ws, 2));
  return _mm_sub_epi32(_mm_setzero_si128(), c);
}

// fp32 scale of one group / block.
template <Int8Weights K>
KESTREL_AVX512 inline float scale_at(const uint8_t* s, int64_t i) {
  if constexpr (K == Int8Weights::kInt4) {
    uint16_t b;
    std::memcpy(&b, s + 2 * i, 2);
    return bf16_to_f32(b);
  } else {
    return 0.5f * e8m0_to_f32(s[i]);
  }
}


// Per-lane scales for the 16 words of chunk c. int4: 128/G bf16 values from group c·128/G;
// MXFP4: 4 E8M0 bytes → 2^(e−128) built from the exponent bits (= 0.5 · e8m0_to_f32, NaN for 255).
template <Int8Weights K>
KESTREL_AVX512 inline __m512 chunk_scales(const uint8_t* row_scales, int64_t c, int64_t G, __m512i idx) {
  if constexpr (K == Int8Weights::kInt4) {
    const int64_t n = 128 / G;
    const __m256i raw = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), row_scales + 2 * (c * n));
    const __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16);
    return _mm512_permutexvar_ps(idx, _mm512_castsi512_ps(bits));
  } else {  // 2^(e−128) from the bits, as 0.5 · e8m0_to_f32: e < 2 → subnormals 0x00200000 << e; e = 255 → NaN
    int32_t four;
    std::memcpy(&four, row_scales + 4 * c, 4);
    const __m128i e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
    __m128i bits = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    bits = _mm_mask_mov_epi32(bits, _mm_cmplt_epu32_mask(e, _mm_set1_epi32(2)), _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e));
    bits = _mm_mask_mov_epi32(bits, _mm_cmpeq_epi32_mask(e, _mm_set1_epi32(255)), _mm_set1_epi32(0x7fc00000));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castsi128_ps(bits)));
  }
}

}  // namespace w4a8_lanes
}  // namespace kestrel::kernels
