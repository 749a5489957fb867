// AVX-512 VNNI kernel for packed Q4_0 and MXFP4 (gguf_q4_x16.h): one zmm lane per weight row of a 16-row
// group. Per block: the group's 4 code units are loaded once and split into low and high nibbles (8 zmm of
// u8 codes: Q4_0 the nibbles 0..15, MXFP4 a byte shuffle of them to 2·E2M1 + 12 ∈ [0, 24]); per token the
// int32 accumulator starts at the block's compensation (Q4_0 −8·Σq, MXFP4 −12·Σq) and takes 8 `vpdpbusd`
// against 4 broadcast activation bytes each, then one conversion, one scale product and one FMA for all
// 16 rows. A tile is one group × up to 8 tokens (8 accumulators, 8 code registers, the scales).
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/gguf_q4_x16_avx512_scales.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma,f16c")))

namespace kestrel::kernels {
namespace {

// Tokens per tile, and tokens per pass over the groups of a row range (their activation rows stay in L2
// while each group's codes are reused from L1 by the pass's tiles).
constexpr int kTile = 8;
constexpr int64_t kPass = 64;

KESTREL_AVX512 inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Nibbles 0..15 as the unsigned bytes vpdpbusd takes: Q4_0 as they are (value + 8), MXFP4 2·E2M1 + 12.
template <WeightFormat F>
KESTREL_AVX512 inline __m512i codes(__m512i nibbles) {
  if constexpr (F == WeightFormat::kGgufQ4_0) {
    return nibbles;
  } else {
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    return _mm512_shuffle_epi8(tbl, nibbles);
  }
}

// The block's compensation from n4 = −8·Σq: Q4_0 n4 itself, MXFP4 −12·Σq = n4 + n4 / 2 (n4 is a multiple
// of 8: exact).
template <WeightFormat F>
inline int32_t compensation(int32_t n4) {
  if constexpr (F == WeightFormat::kGgufQ4_0) return n4;
  else return n4 + (n4 >> 1);
}

// One group (codes at g, nb blocks) against N tokens; rows outside `mask` are not stored.
template <WeightFormat F, int N>
KESTREL_AVX512 void tile(const uint8_t* g, int64_t nb, const int8_t* const* X, const int32_t* const* C,
                         const float* const* D, float* y, int64_t ldy, __mmask16 mask) {
  __m512 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ4x16BlockBytes;
    const __m512 dw = x16::row_scales<F>(p);
    __m512i lo[4], hi[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512i raw = _mm512_loadu_si512(p + 32 + 64 * u);  // 32-byte aligned
      lo[u] = codes<F>(_mm512_and_si512(raw, nib));
      hi[u] = codes<F>(_mm512_and_si512(_mm512_srli_epi16(raw, 4), nib));
    }
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const int8_t* xb = X[t] + b * 32;
      __m512i s = _mm512_set1_epi32(compensation<F>(C[t][4 * b]));  // from −8·Σq of the block (Q8Acts::n4)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        s = _mm512_dpbusd_epi32(s, lo[u], bcast4(xb + 4 * u));
        s = _mm512_dpbusd_epi32(s, hi[u], bcast4(xb + 16 + 4 * u));
      }
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(D[t][b])), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

template <WeightFormat F, int N>
KESTREL_AVX512 void tile_at(const uint8_t* g, int64_t nb, const Q8Acts& a, const int32_t* tok, int64_t i0, float* y,
                            int64_t ldy, __mmask16 mask) {
  const int8_t* X[N];
  const int32_t* C[N];
  const float* D[N];
  for (int i = 0; i < N; ++i) {
    const Q4x16Token k = q4_x16_token(a, tok ? tok[i0 + i] : i0 + i);
    X[i] = k.q, C[i] = k.n4, D[i] = k.d;
  }
  tile<F, N>(g, nb, X, C, D, y + i0 * ldy, ldy, mask);
}

template <WeightFormat F>
KESTREL_AVX512 void tokens(const uint8_t* g, int64_t nb, const Q8Acts& a, const int32_t* tok, int64_t i0, int64_t i1,
                           float* y, int64_t ldy, __mmask16 mask) {
  int64_t i = i0;
  for (; i + kTile <= i1; i += kTile) tile_at<F, kTile>(g, nb, a, tok, i, y, ldy, mask);
  switch (i1 - i) {
    case 7: return tile_at<F, 7>(g, nb, a, tok, i, y, ldy, mask);
    case 6: return tile_at<F, 6>(g, nb, a, tok, i, y, ldy, mask);
    case 5: return tile_at<F, 5>(g, nb, a, tok, i, y, ldy, mask);
    case 4: return tile_at<F, 4>(g, nb, a, tok, i, y, ldy, mask);
    case 3: return tile_at<F, 3>(g, nb, a, tok, i, y, ldy, mask);
    case 2: return tile_at<F, 2>(g, nb, a, tok, i, y, ldy, mask);
    case 1: return tile_at<F, 1>(g, nb, a, tok, i, y, ldy, mask);
    default: return;
  }
}

template <WeightFormat F>
KESTREL_AVX512 void rows(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
  const int64_t nb = a.nb, gbytes = nb * kQ4x16BlockBytes;
  for (int64_t p0 = 0; p0 < n; p0 += kPass) {
    const int64_t p1 = std::min(n, p0 + kPass);
    for (int64_t g = r0 / kQ4x16Rows; g * kQ4x16Rows < r1; ++g) {
      const int64_t lo = std::max(r0, g * kQ4x16Rows), hi = std::min(r1, (g + 1) * kQ4x16Rows);
      const auto mask = static_cast<__mmask16>(((1u << (hi - lo)) - 1u) << (lo - g * kQ4x16Rows));
      // The tile stores 16 rows from the group's first row; the mask keeps [lo, hi).
      tokens<F>(w.packed + g * gbytes, nb, a, tok, p0, p1, y + g * kQ4x16Rows, ldy, mask);
    }
  }
}

}  // namespace

void q4_x16_rows_avx512(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                        int64_t r0, int64_t r1) {
  KCHECK(x16_format(w.format) && w.packed != nullptr && w.in == a.in && a.gemm_q4,
         "q4_x16_rows_avx512: needs packed Q4_0 or MXFP4 weights and activations with their Q4_0 layout");
  KCHECK(r0 >= 0 && r1 <= w.out, "q4_x16_rows_avx512: rows out of range");
  if (tok != nullptr)
    for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "q4_x16_rows_avx512: token index out of range");
  if (r0 >= r1 || n <= 0) return;
  if (w.format == WeightFormat::kGgufMxfp4) return rows<WeightFormat::kGgufMxfp4>(w, a, tok, n, y, ldy, r0, r1);
  rows<WeightFormat::kGgufQ4_0>(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace kestrel::kernels
