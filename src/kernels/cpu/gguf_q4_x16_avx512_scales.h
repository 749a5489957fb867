// Internal to kernels/cpu: the 16 rows' d_w of a packed Q4_0 / MXFP4 block (gguf_q4_x16.h) in one zmm, shared
// by the AVX-512 kernel and its AMX tile form so both build the same bits.
// GCC 12 false positive in its AVX-512 headers (GCC PR105593): the includers silence it.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace kestrel::kernels::x16 {

// The block at p (32-byte aligned). Q4_0: its 16 fp16 scales. MXFP4: 2^(e−128) as gguf_e8m0_half builds its
// bits (e < 2: the subnormal 0x00200000 << e; else (e − 1) << 23).
template <WeightFormat F>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline __m512 row_scales(const uint8_t* p) {
  if constexpr (F == WeightFormat::kGgufQ4_0) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, sub));
  }
}

}  // namespace kestrel::kernels::x16
