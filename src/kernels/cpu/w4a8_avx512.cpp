// AVX-512 VNNI path (vpdpbusd). Per 128-element chunk of a row: one 64-byte load of packed weights;
// low nibbles are the chunk's even elements, high nibbles its odd ones, matching the activations'
// SIMD order (w4a8_format.h), so lane i of dpbusd(lo, x_even) + dpbusd(hi, x_odd) is the sum over
// packed word i. Accumulators start at −c·Σx per word (the u8-offset compensation), are converted to
// fp32 per chunk and scaled by each lane's group scale. Register block: R rows × U tokens.
// Compiled for AVX-512 by function attributes only; the dispatcher calls it only when supported.
// GCC 12 false positive: its AVX-512 headers build "undefined" vectors from a self-initialised local
// (__Y), which -Wmaybe-uninitialized reports inside every inlined intrinsic (GCC PR105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/w4a8_kernels.h"
#include "tensor/dtype.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma")))

namespace kestrel::kernels {
namespace {

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

template <Int8Weights K, int R, int U>
KESTREL_AVX512 void block(const Int8GemmTask& t, int64_t r0, int64_t n0, __m512i idx) {
  const QuantizedActs& a = *t.acts;
  const int64_t in = t.in, full = in / 128, tails = (in - full * 128) / 32;
  const int64_t G = K == Int8Weights::kInt4 ? t.group : 32, groups = in / G;
  const int64_t sbytes = K == Int8Weights::kInt4 ? 2 : 1;
  const uint8_t* W[R];
  const uint8_t* S[R];
  for (int r = 0; r < R; ++r) W[r] = t.packed + (r0 + r) * (in / 2), S[r] = t.scales + (r0 + r) * groups * sbytes;
  const int8_t* X[U];
  const int32_t* WS[U];
  for (int u = 0; u < U; ++u) X[u] = a.qp.data() + (n0 + u) * in, WS[u] = a.wsum.data() + (n0 + u) * (in / 8);
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < full; ++c) {
    __m512i xe[U], xo[U], nc[U];
    for (int u = 0; u < U; ++u) {
      xe[u] = _mm512_loadu_si512(X[u] + c * 128);
      xo[u] = _mm512_loadu_si512(X[u] + c * 128 + 64);
      nc[u] = neg_comp<K>(_mm512_loadu_si512(WS[u] + c * 16));
    }
    for (int r = 0; r < R; ++r) {
      __m512i lo, hi;
      unpack<K>(_mm512_loadu_si512(W[r] + c * 64), lo, hi);
      const __m512 sc = chunk_scales<K>(S[r], c, G, idx);
      for (int u = 0; u < U; ++u) {
        const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(nc[u], lo, xe[u]), hi, xo[u]);
        acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[r][u]);
      }
    }
  }
  __m128 tacc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) tacc[r][u] = _mm_setzero_ps();
  for (int64_t j = 0; j < tails; ++j) {  // 32-element chunks after the last full 128
    const int64_t e0 = full * 128 + j * 32;
    __m128i xe[U], xo[U], nc[U];
    for (int u = 0; u < U; ++u) {
      xe[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(X[u] + e0));
      xo[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(X[u] + e0 + 16));
      nc[u] = neg_comp128<K>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(WS[u] + e0 / 8)));
    }
    for (int r = 0; r < R; ++r) {
      __m128i hi;
      const __m128i lo = unpack_lo128<K>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W[r] + e0 / 2)), hi);
      const __m128 sc = _mm_set1_ps(scale_at<K>(S[r], e0 / G));
      for (int u = 0; u < U; ++u) {
        const __m128i d = _mm_dpbusd_epi32(_mm_dpbusd_epi32(nc[u], lo, xe[u]), hi, xo[u]);
        tacc[r][u] = _mm_fmadd_ps(_mm_cvtepi32_ps(d), sc, tacc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      const float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][u], _mm512_zextps128_ps512(tacc[r][u])));
      t.y[(n0 + u) * t.ldy + r0 + r] = s * a.scale[static_cast<size_t>(n0 + u)];
    }
}

template <Int8Weights K, int R>
KESTREL_AVX512 void rows(const Int8GemmTask& t, int64_t r0, __m512i idx) {
  // MXFP4 needs more live registers per row (table, E8M0 decode constants): 2 tokens per block
  // keeps the R × U accumulators and operands inside the 32 zmm registers.
  constexpr int U = K == Int8Weights::kMxfp4 ? 2 : 4;
  const int64_t T = t.acts->T;
  int64_t n = 0;
  for (; n + U <= T; n += U) block<K, R, U>(t, r0, n, idx);
  for (; n < T; ++n) block<K, R, 1>(t, r0, n, idx);
}

template <Int8Weights K>
KESTREL_AVX512 void run(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  // Lane i of a chunk covers word i (elements 8i..8i+7), whose group is i·8/G within the chunk.
  const int shift = K == Int8Weights::kInt4 ? __builtin_ctzll(static_cast<unsigned long long>(t.group / 8)) : 2;
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = i >> shift;
  const __m512i idx = _mm512_load_si512(lane_group);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows<K, 4>(t, r, idx);
  for (; r < r1; ++r) rows<K, 1>(t, r, idx);
}

}  // namespace

KESTREL_AVX512 void int8_rows_avx512(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  if (t.kind == Int8Weights::kInt4) run<Int8Weights::kInt4>(t, r0, r1);
  else run<Int8Weights::kMxfp4>(t, r0, r1);
}

}  // namespace kestrel::kernels
