// AVX2 loads of GGUF Q8_0 / MXFP4 block chunks shared by the small-T kernel (gguf_int8_avx2.cpp) and the
// GEMM form's stripe unpack (gguf_int8_gemm_avx2.cpp): a chunk's block scales as fp32, spread to the
// kernel's lanes, and its (MXFP4) code bytes two blocks to a ymm.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gguf_int8_blocks.h"

#define KESTREL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace kestrel::kernels::gguf_avx2 {

using gguf_blocks::Kind;
using gguf_blocks::kBlockBytes;
using gguf_blocks::kCodeOffset;

// The fp32 scales of the n (≤ 4) blocks starting at `blk` (the rest 0). Q8_0: the four fp16 words
// in one vcvtph2ps; MXFP4: 2^(e−128) from the E8M0 bytes as gguf_e8m0_half computes it (e < 2: subnormals).
template <Kind K>
KESTREL_AVX2 inline __m128 block_scales(const uint8_t* blk, int n) {
  constexpr int64_t B = kBlockBytes<K>;
  if constexpr (K == Kind::kMxfp4) {
    __m128i e;
    if (n == 4) {
      e = _mm_setr_epi32(blk[0], blk[B], blk[2 * B], blk[3 * B]);
    } else {
      alignas(16) int32_t v[4] = {0, 0, 0, 0};
      for (int k = 0; k < n; ++k) v[k] = blk[k * B];
      e = _mm_load_si128(reinterpret_cast<const __m128i*>(v));
    }
    const __m128i big = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    const __m128i small = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
    __m128 s = _mm_castsi128_ps(_mm_blendv_epi8(big, small, _mm_cmpgt_epi32(_mm_set1_epi32(2), e)));
    if (n < 4) s = _mm_and_ps(s, _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3))));
    return s;
  } else {
    auto word = [&](int k) -> uint64_t {
      uint16_t h;
      std::memcpy(&h, blk + k * B, 2);
      return h;
    };
    uint64_t v = 0;
    if (n == 4) {
      v = word(0) | word(1) << 16 | word(2) << 32 | word(3) << 48;
    } else {
      for (int k = 0; k < n; ++k) v |= word(k) << (16 * k);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(v)));
  }
}

// Lanes 0-7 of a 4-float vector spread to its blocks' lanes: (0,0,0,0,1,1,1,1) and (2,2,2,2,3,3,3,3).
KESTREL_AVX2 inline __m256 spread_lo(__m128 v) {
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}
KESTREL_AVX2 inline __m256 spread_hi(__m128 v) {
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
}

// The 16 code bytes of blocks k and k+1 of a chunk (each present or zero) → one ymm.
template <Kind K>
KESTREL_AVX2 inline __m256i code_pair(const uint8_t* blk, int present) {
  constexpr int64_t B = kBlockBytes<K>, O = kCodeOffset<K>;
  auto ld = [&](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k * B + O)); };
  if (present >= 2) return _mm256_inserti128_si256(_mm256_castsi128_si256(ld(0)), ld(1), 1);
  if (present == 1) return _mm256_zextsi128_si256(ld(0));
  return _mm256_setzero_si256();
}

}  // namespace kestrel::kernels::gguf_avx2
