// prefill_exp (prefill_attention.h) on 16 lanes (AVX-512) and 8 lanes (AVX2 + FMA): the scalar definition's
// operations in the same order, so every lane has its bits (0 below kExpMin, as the scalar form). For the
// attention kernels that share that exp: the tiled prefill (prefill_attention*.cpp) and latent attention in
// key tiles (sparse_mla_attention*.cpp).
#pragma once

#include <immintrin.h>

#include "kernels/cpu/prefill_attention_tiles.h"

namespace kestrel::kernels {

__attribute__((target("avx512f,avx512dq,fma"))) inline __m512 exp16(__m512 x) {
  using namespace prefill_tiles;
  const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kTaylor[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kTaylor[i]));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
}

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  using namespace prefill_tiles;
  const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kTaylor[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kTaylor[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(ok, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace kestrel::kernels
