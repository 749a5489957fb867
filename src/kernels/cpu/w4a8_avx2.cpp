// AVX2 path (vpmaddubsw + vpmaddwd). Same data flow as the AVX-512 path (w4a8_avx512.cpp) on 256-bit
// halves: a 128-element chunk is two halves of 32 packed bytes; lo/hi nibbles × the even/odd
// activation bytes give int16 pair sums (|u·x| pairs ≤ 2·24·127, lo + hi ≤ 12192: no saturation),
// vpmaddwd with ones makes int32 lanes = packed words, then −c·Σx, fp32, × lane scale.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/w4a8_kernels.h"
#include "tensor/dtype.h"

#define KESTREL_AVX2 __attribute__((target("avx2,fma")))

namespace kestrel::kernels {
namespace {

template <Int8Weights K>
KESTREL_AVX2 inline __m256i table256(__m256i v) {
  if constexpr (K == Int8Weights::kMxfp4) {
    const __m256i tbl = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm256_shuffle_epi8(tbl, v);
  } else {
    return v;
  }
}
template <Int8Weights K>
KESTREL_AVX2 inline __m128i table128(__m128i v) {
  if constexpr (K == Int8Weights::kMxfp4) {
    return _mm_shuffle_epi8(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0), v);
  } else {
    return v;
  }
}

template <Int8Weights K>
KESTREL_AVX2 inline float scale_at(const uint8_t* s, int64_t i) {
  if constexpr (K == Int8Weights::kInt4) {
    uint16_t b;
    std::memcpy(&b, s + 2 * i, 2);
    return bf16_to_f32(b);
  } else {
    return 0.5f * e8m0_to_f32(s[i]);
  }
}

template <Int8Weights K>
KESTREL_AVX2 inline int32_t comp_mul() {
  return K == Int8Weights::kInt4 ? 8 : 12;
}

// pf (the first token block of these rows): prefetch the next register blocks' rows (int8_prefetch_ahead).
template <Int8Weights K, int R, int U>
KESTREL_AVX2 void block(const Int8GemmTask& t, int64_t r0, int64_t n0, bool pf) {
  const QuantizedActs& a = *t.acts;
  const int64_t in = t.in, full = in / 128, tails = (in - full * 128) / 32;
  const int64_t G = K == Int8Weights::kInt4 ? t.group : 32, groups = in / G;
  const int64_t sbytes = K == Int8Weights::kInt4 ? 2 : 1;
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const __m256i cm = _mm256_set1_epi32(comp_mul<K>());
  const uint8_t* W[R];
  const uint8_t* S[R];
  for (int r = 0; r < R; ++r) W[r] = t.packed + (r0 + r) * (in / 2), S[r] = t.scales + (r0 + r) * groups * sbytes;
  const int8_t* X[U];
  const int32_t* WS[U];
  for (int u = 0; u < U; ++u) X[u] = a.qp.data() + (n0 + u) * in, WS[u] = a.wsum.data() + (n0 + u) * (in / 8);
  __m256 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm256_setzero_ps();
  for (int64_t c = 0; c < full; ++c) {
    if (pf) {
      const int64_t sc0 = c * 128 / G * sbytes;  // this chunk's first scale byte in the row
      for (int r = 0; r < R; ++r) {
        int8_prefetch_ahead(W[r] + c * 64, R * (in / 2));
        if (sc0 % 64 < 128 / G * sbytes) int8_prefetch_ahead(S[r] + sc0, R * groups * sbytes);
      }
    }
    for (int h = 0; h < 2; ++h) {  // elements c·128 + h·64 .. +64: words c·16 + h·8 .. +8
      __m256i xe[U], xo[U], comp[U];
      for (int u = 0; u < U; ++u) {
        xe[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(X[u] + c * 128 + h * 32));
        xo[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(X[u] + c * 128 + 64 + h * 32));
        comp[u] = _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(WS[u] + c * 16 + h * 8)), cm);
      }
      const int64_t e0 = c * 128 + h * 64;
      for (int r = 0; r < R; ++r) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(W[r] + e0 / 2));
        const __m256i lo = table256<K>(_mm256_and_si256(b, nib));
        const __m256i hi = table256<K>(_mm256_and_si256(_mm256_srli_epi16(b, 4), nib));
        // Lanes 0-3 cover elements e0..e0+31, lanes 4-7 e0+32..e0+63: two groups when G = 32.
        const float s0 = scale_at<K>(S[r], e0 / G), s1 = G == 32 ? scale_at<K>(S[r], e0 / G + 1) : s0;
        const __m256 sc = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
        for (int u = 0; u < U; ++u) {
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe[u]), _mm256_maddubs_epi16(hi, xo[u]));
          const __m256i d = _mm256_sub_epi32(_mm256_madd_epi16(p, ones), comp[u]);
          acc[r][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, acc[r][u]);
        }
      }
    }
  }
  for (int64_t j = 0; j < tails; ++j) {
    const int64_t e0 = full * 128 + j * 32;
    __m128i xe[U], xo[U], comp[U];
    for (int u = 0; u < U; ++u) {
      xe[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(X[u] + e0));
      xo[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(X[u] + e0 + 16));
      comp[u] = _mm_mullo_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(WS[u] + e0 / 8)),
                                _mm256_castsi256_si128(cm));
    }
    for (int r = 0; r < R; ++r) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(W[r] + e0 / 2));
      const __m128i lo = table128<K>(_mm_and_si128(b, _mm256_castsi256_si128(nib)));
      const __m128i hi = table128<K>(_mm_and_si128(_mm_srli_epi16(b, 4), _mm256_castsi256_si128(nib)));
      const __m128 sc = _mm_set1_ps(scale_at<K>(S[r], e0 / G));
      for (int u = 0; u < U; ++u) {
        const __m128i p = _mm_add_epi16(_mm_maddubs_epi16(lo, xe[u]), _mm_maddubs_epi16(hi, xo[u]));
        const __m128i d = _mm_sub_epi32(_mm_madd_epi16(p, _mm256_castsi256_si128(ones)), comp[u]);
        // Folded into the low half of the 256-bit accumulator.
        const __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(d), sc);
        acc[r][u] = _mm256_add_ps(acc[r][u], _mm256_insertf128_ps(_mm256_setzero_ps(), v, 0));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r][u]), _mm256_extractf128_ps(acc[r][u], 1));
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      const float s = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
      t.y[(n0 + u) * t.ldy + r0 + r] = s * a.scale[static_cast<size_t>(n0 + u)];
    }
}

template <Int8Weights K, int R>
KESTREL_AVX2 void rows(const Int8GemmTask& t, int64_t r0) {
  const int64_t T = t.acts->T;
  int64_t n = 0;
  for (; n + 4 <= T; n += 4) block<K, R, 4>(t, r0, n, n == 0);
  for (; n < T; ++n) block<K, R, 1>(t, r0, n, n == 0);
}

template <Int8Weights K>
KESTREL_AVX2 void run(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows<K, 4>(t, r);
  for (; r < r1; ++r) rows<K, 1>(t, r);
}

}  // namespace

KESTREL_AVX2 void int8_rows_avx2(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  if (t.kind == Int8Weights::kInt4) run<Int8Weights::kInt4>(t, r0, r1);
  else run<Int8Weights::kMxfp4>(t, r0, r1);
}

}  // namespace kestrel::kernels
