// AVX2 kernel for packed Q4_0 (gguf_q4_x16.h) on CPUs without AVX-512 VNNI: the group's 16 rows as two
// halves of 8 ymm lanes. Per block, half and token: 8 `vpmaddubsw` (u8 codes 0..15 × 4 broadcast activation
// bytes; each int16 lane ≤ 2·15·127) summed in int16 (≤ 8·3810 = 30480, no overflow), one `vpmaddwd` with
// ones to the row's int32, plus −8·Σq of the block: the exact integer the AVX-512 kernel forms. Then the
// same conversion, scale product and FMA, so each token gets the AVX-512 kernel's bits.
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

KESTREL_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Half h (rows 8h .. 8h+7) of one group against N tokens; `rows` of the 8 are stored (from the first).
template <int N>
KESTREL_AVX2 void tile(const uint8_t* g, int64_t nb, int h, const int8_t* const* X, const int32_t* const* C,
                       const float* const* D, float* y, int64_t ldy, int first, int count) {
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ4x16BlockBytes;
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    __m256i lo[4], hi[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * u + 32 * h));
      lo[u] = _mm256_and_si256(raw, nib);
      hi[u] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
    }
#pragma GCC unroll 4
    for (int t = 0; t < N; ++t) {
      const int8_t* xb = X[t] + b * 32;
      __m256i s16 = _mm256_maddubs_epi16(lo[0], bcast4(xb));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], bcast4(xb + 16)));
#pragma GCC unroll 3
      for (int u = 1; u < 4; ++u) {
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[u], bcast4(xb + 4 * u)));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[u], bcast4(xb + 16 + 4 * u)));
      }
      const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(C[t][4 * b]));
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
// float operations per row, so the same bits.
KESTREL_AVX2 void tile1(const uint8_t* g, int64_t nb, const int8_t* x, const int32_t* c, const float* d, float* y, int first,
                        int count) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ4x16BlockBytes;
    const int8_t* xb = x + b * 32;
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m256i xl = bcast4(xb + 4 * u), xh = bcast4(xb + 16 + 4 * u);
      const __m256i r0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * u));
      const __m256i r1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 + 64 * u));
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(r0, nib), xl));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(r1, nib), xl));
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r0, 4), nib), xh));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r1, 4), nib), xh));
    }
    const __m256i n = _mm256_set1_epi32(c[4 * b]);
    const __m256 dx = _mm256_set1_ps(d[b]);
    const __m256 dw0 = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 dw1 = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(s0, ones), n)), _mm256_mul_ps(dw0, dx), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(s1, ones), n)), _mm256_mul_ps(dw1, dx), acc1);
  }
  alignas(32) float v[16];
  _mm256_store_ps(v, acc0);
  _mm256_store_ps(v + 8, acc1);
  std::memcpy(y + first, v + first, static_cast<size_t>(count) * sizeof(float));
}

template <int N>
KESTREL_AVX2 void tile_at(const uint8_t* g, int64_t nb, int h, const Q8Acts& a, const int32_t* tok, int64_t i0, float* y,
                          int64_t ldy, int first, int count) {
  const int8_t* X[N];
  const int32_t* C[N];
  const float* D[N];
  for (int i = 0; i < N; ++i) {
    const Q4x16Token k = q4_x16_token(a, tok ? tok[i0 + i] : i0 + i);
    X[i] = k.q, C[i] = k.n4, D[i] = k.d;
  }
  tile<N>(g, nb, h, X, C, D, y + i0 * ldy, ldy, first, count);
}

KESTREL_AVX2 void tokens(const uint8_t* g, int64_t nb, int h, const Q8Acts& a, const int32_t* tok, int64_t i0, int64_t i1,
                         float* y, int64_t ldy, int first, int count) {
  int64_t i = i0;
  for (; i + kTile <= i1; i += kTile) tile_at<kTile>(g, nb, h, a, tok, i, y, ldy, first, count);
  switch (i1 - i) {
    case 3: return tile_at<3>(g, nb, h, a, tok, i, y, ldy, first, count);
    case 2: return tile_at<2>(g, nb, h, a, tok, i, y, ldy, first, count);
    case 1: return tile_at<1>(g, nb, h, a, tok, i, y, ldy, first, count);
    default: return;
  }
}

}  // namespace

KESTREL_AVX2 void q4_x16_rows_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y,
                                   int64_t ldy, int64_t r0, int64_t r1) {
  KCHECK(w.format == WeightFormat::kGgufQ4_0 && w.packed != nullptr && w.in == a.in && a.gemm_q4,
         "q4_x16_rows_avx2: needs packed Q4_0 weights and activations with their Q4_0 layout");
  KCHECK(r0 >= 0 && r1 <= w.out, "q4_x16_rows_avx2: rows out of range");
  if (tok != nullptr)
    for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "q4_x16_rows_avx2: token index out of range");
  if (r0 >= r1 || n <= 0) return;
  const int64_t nb = a.nb, gbytes = nb * kQ4x16BlockBytes;
  if (n == 1) {  // decode: one pass per group
    const Q4x16Token k = q4_x16_token(a, tok ? tok[0] : 0);
    for (int64_t g = r0 / kQ4x16Rows; g * kQ4x16Rows < r1; ++g) {
      const int64_t lo = std::max(r0, g * kQ4x16Rows), hi = std::min(r1, (g + 1) * kQ4x16Rows);
      tile1(w.packed + g * gbytes, nb, k.q, k.n4, k.d, y + g * kQ4x16Rows, static_cast<int>(lo - g * kQ4x16Rows),
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
        tokens(w.packed + g * gbytes, nb, h, a, tok, p0, p1, y + base, ldy, static_cast<int>(lo - base),
               static_cast<int>(hi - lo));
      }
  }
}

}  // namespace kestrel::kernels
