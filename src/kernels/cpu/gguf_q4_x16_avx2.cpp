// AVX2 kernel for packed Q4_0 and MXFP4 (gguf_q4_x16.h) on CPUs without AVX-512 VNNI: the group's 16 rows
// as two halves of 8 ymm lanes. Codes are the AVX-512 kernel's unsigned bytes (Q4_0 0..15, MXFP4
// 2·E2M1 + 12 ∈ [0, 24] by a byte shuffle). Per block, half and token: 8 `vpmaddubsw` against 4 broadcast
// activation bytes each, summed in int16 and widened by `vpmaddwd` with ones to the row's int32, plus the
// block's compensation (−8·Σq, −12·Σq): the exact integer the AVX-512 kernel forms. Each int16 lane of a
// `vpmaddubsw` is at most 2·15·127 = 3810 (Q4_0) or 2·24·127 = 6096 (MXFP4) in magnitude, so Q4_0 sums all 8
// in int16 (≤ 30480) while MXFP4 sums two partials of 4 (≤ 24384) and widens each. Then the same
// conversion, scale product and FMA, so each token gets the AVX-512 kernel's bits.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/gguf_q4_x16.h"

#define KESTREL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace kestrel::kernels {
namespace {

constexpr int kTile = 4;
constexpr int64_t kPass = 64;
constexpr bool kMx(WeightFormat f) { return f == WeightFormat::kGgufMxfp4; }

KESTREL_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// d_w of rows 8h .. 8h+7 of the block at p (32-byte aligned). MXFP4: 2^(e−128) as gguf_e8m0_half builds
// its bits (e < 2: the subnormal 0x00200000 << e; else (e − 1) << 23).
template <WeightFormat F>
KESTREL_AVX2 inline __m256 row_scales(const uint8_t* p, int h) {
  if constexpr (!kMx(F)) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
  } else {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
  }
}

// Nibbles 0..15 as the unsigned bytes vpmaddubsw takes: Q4_0 as they are (value + 8), MXFP4 2·E2M1 + 12.
template <WeightFormat F>
KESTREL_AVX2 inline __m256i codes(__m256i nibbles) {
  if constexpr (!kMx(F)) {
    return nibbles;
  } else {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    return _mm256_shuffle_epi8(tbl, nibbles);
  }
}

// The block's compensation from n4 = −8·Σq: Q4_0 n4 itself, MXFP4 −12·Σq = n4 + n4 / 2 (n4 is a multiple
// of 8: exact).
template <WeightFormat F>
inline int32_t compensation(int32_t n4) {
  if constexpr (!kMx(F)) return n4;
  else return n4 + (n4 >> 1);
}

// Σ of code byte × activation byte over the block, per row lane (exact int32, compensation not added).
// Q4_0: all 8 vpmaddubsw summed in int16 (≤ 30480); MXFP4: units 0, 1 and units 2, 3 as two int16 partials
// (≤ 24384 each), each widened.
template <WeightFormat F>
KESTREL_AVX2 inline __m256i code_dot(const __m256i (&lo)[4], const __m256i (&hi)[4], const int8_t* xb, __m256i ones) {
  if constexpr (!kMx(F)) {
    __m256i s16 = _mm256_maddubs_epi16(lo[0], bcast4(xb));
    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], bcast4(xb + 16)));
#pragma GCC unroll 3
    for (int u = 1; u < 4; ++u) {
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[u], bcast4(xb + 4 * u)));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[u], bcast4(xb + 16 + 4 * u)));
    }
    return _mm256_madd_epi16(s16, ones);
  } else {
    __m256i s32[2];
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      const int u = 2 * k;
      __m256i s16 = _mm256_maddubs_epi16(lo[u], bcast4(xb + 4 * u));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[u], bcast4(xb + 16 + 4 * u)));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[u + 1], bcast4(xb + 4 * u + 4)));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[u + 1], bcast4(xb + 16 + 4 * u + 4)));
      s32[k] = _mm256_madd_epi16(s16, ones);
    }
    return _mm256_add_epi32(s32[0], s32[1]);
  }
}

// Half h (rows 8h .. 8h+7) of one group against N tokens; `rows` of the 8 are stored (from the first).
template <WeightFormat F, int N>
KESTREL_AVX2 void tile(const uint8_t* g, int64_t nb, int h, const int8_t* const* X, const int32_t* const* C,
                       const float* const* D, float* y, int64_t ldy, int first, int count) {
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ4x16BlockBytes;
    const __m256 dw = row_scales<F>(p, h);
    __m256i lo[4], hi[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * u + 32 * h));
      lo[u] = codes<F>(_mm256_and_si256(raw, nib));
      hi[u] = codes<F>(_mm256_and_si256(_mm256_srli_epi16(raw, 4), nib));
    }
#pragma GCC unroll 4
    for (int t = 0; t < N; ++t) {
      const __m256i n = _mm256_set1_epi32(compensation<F>(C[t][4 * b]));
      const __m256i s = _mm256_add_epi32(code_dot<F>(lo, hi, X[t] + b * 32, ones), n);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(D[t][b])), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) {
    if (first == 0 && count == 8) {
      _mm256_storeu_ps(y + t * ldy, acc[t]);
    } else {
      alignas(32) float v[8];
      _mm256_store_ps(v, acc[t]);
      std::memcpy(y + t * ldy + first, v + first, static_cast<size_t>(count) * sizeof(float));
    }
  }
}

// One token against a whole group (both halves in one pass, each activation broadcast made once): the
// decode form, where the two-pass tile above is bound by its instruction count. The same integers and
// float operations per row, so the same bits. MXFP4 keeps units 0, 1 and 2, 3 in separate int16 sums.
template <WeightFormat F>
KESTREL_AVX2 void tile1(const uint8_t* g, int64_t nb, const int8_t* x, const int32_t* c, const float* d, float* y, int first,
                        int count) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ4x16BlockBytes;
    const int8_t* xb = x + b * 32;
    __m256i s0[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256i s1[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const int k = kMx(F) ? u / 2 : 0;
      const __m256i xl = bcast4(xb + 4 * u), xh = bcast4(xb + 16 + 4 * u);
      const __m256i r0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * u));
      const __m256i r1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 + 64 * u));
      s0[k] = _mm256_add_epi16(s0[k], _mm256_maddubs_epi16(codes<F>(_mm256_and_si256(r0, nib)), xl));
      s1[k] = _mm256_add_epi16(s1[k], _mm256_maddubs_epi16(codes<F>(_mm256_and_si256(r1, nib)), xl));
      s0[k] = _mm256_add_epi16(s0[k], _mm256_maddubs_epi16(codes<F>(_mm256_and_si256(_mm256_srli_epi16(r0, 4), nib)), xh));
      s1[k] = _mm256_add_epi16(s1[k], _mm256_maddubs_epi16(codes<F>(_mm256_and_si256(_mm256_srli_epi16(r1, 4), nib)), xh));
    }
    __m256i i0 = _mm256_madd_epi16(s0[0], ones), i1 = _mm256_madd_epi16(s1[0], ones);
    if constexpr (kMx(F)) {
      i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(s0[1], ones));
      i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(s1[1], ones));
    }
    const __m256i n = _mm256_set1_epi32(compensation<F>(c[4 * b]));
    const __m256 dx = _mm256_set1_ps(d[b]);
    const __m256 dw0 = row_scales<F>(p, 0), dw1 = row_scales<F>(p, 1);
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(i0, n)), _mm256_mul_ps(dw0, dx), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(i1, n)), _mm256_mul_ps(dw1, dx), acc1);
  }
  alignas(32) float v[16];
  _mm256_store_ps(v, acc0);
  _mm256_store_ps(v + 8, acc1);
  std::memcpy(y + first, v + first, static_cast<size_t>(count) * sizeof(float));
}

template <WeightFormat F, int N>
KESTREL_AVX2 void tile_at(const uint8_t* g, int64_t nb, int h, const Q8Acts& a, const int32_t* tok, int64_t i0, float* y,
                          int64_t ldy, int first, int count) {
  const int8_t* X[N];
  const int32_t* C[N];
  const float* D[N];
  for (int i = 0; i < N; ++i) {
    const Q4x16Token k = q4_x16_token(a, tok ? tok[i0 + i] : i0 + i);
    X[i] = k.q, C[i] = k.n4, D[i] = k.d;
  }
  tile<F, N>(g, nb, h, X, C, D, y + i0 * ldy, ldy, first, count);
}

template <WeightFormat F>
KESTREL_AVX2 void tokens(const uint8_t* g, int64_t nb, int h, const Q8Acts& a, const int32_t* tok, int64_t i0, int64_t i1,
                         float* y, int64_t ldy, int first, int count) {
  int64_t i = i0;
  for (; i + kTile <= i1; i += kTile) tile_at<F, kTile>(g, nb, h, a, tok, i, y, ldy, first, count);
  switch (i1 - i) {
    case 3: return tile_at<F, 3>(g, nb, h, a, tok, i, y, ldy, first, count);
    case 2: return tile_at<F, 2>(g, nb, h, a, tok, i, y, ldy, first, count);
    case 1: return tile_at<F, 1>(g, nb, h, a, tok, i, y, ldy, first, count);
    default: return;
  }
}

template <WeightFormat F>
KESTREL_AVX2 void rows(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
  const int64_t nb = a.nb, gbytes = nb * kQ4x16BlockBytes;
  if (n == 1) {  // decode: one pass per group
    const Q4x16Token k = q4_x16_token(a, tok ? tok[0] : 0);
    for (int64_t g = r0 / kQ4x16Rows; g * kQ4x16Rows < r1; ++g) {
      const int64_t lo = std::max(r0, g * kQ4x16Rows), hi = std::min(r1, (g + 1) * kQ4x16Rows);
      tile1<F>(w.packed + g * gbytes, nb, k.q, k.n4, k.d, y + g * kQ4x16Rows, static_cast<int>(lo - g * kQ4x16Rows),
               static_cast<int>(hi - lo));
    }
    return;
  }
  for (int64_t p0 = 0; p0 < n; p0 += kPass) {
    const int64_t p1 = std::min(n, p0 + kPass);
    for (int64_t g = r0 / kQ4x16Rows; g * kQ4x16Rows < r1; ++g)
      for (int h = 0; h < 2; ++h) {
        const int64_t base = g * kQ4x16Rows + 8 * h;
        const int64_t lo = std::max(r0, base), hi = std::min(r1, base + 8);
        if (lo >= hi) continue;
        tokens<F>(w.packed + g * gbytes, nb, h, a, tok, p0, p1, y + base, ldy, static_cast<int>(lo - base),
                  static_cast<int>(hi - lo));
      }
  }
}

}  // namespace

void q4_x16_rows_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                      int64_t r0, int64_t r1) {
  KCHECK(x16_format(w.format) && w.packed != nullptr && w.in == a.in && a.gemm_q4,
         "q4_x16_rows_avx2: needs packed Q4_0 or MXFP4 weights and activations with their Q4_0 layout");
  KCHECK(r0 >= 0 && r1 <= w.out, "q4_x16_rows_avx2: rows out of range");
  if (tok != nullptr)
    for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "q4_x16_rows_avx2: token index out of range");
  if (r0 >= r1 || n <= 0) return;
  if (w.format == WeightFormat::kGgufMxfp4) return rows<WeightFormat::kGgufMxfp4>(w, a, tok, n, y, ldy, r0, r1);
  rows<WeightFormat::kGgufQ4_0>(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace kestrel::kernels
