// lane_dot.h: the scalar definition and its AVX-512 and AVX2 + FMA forms.
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "base/check.h"
#include "kernels/cpu/avx2_lanes.h"
#include "kernels/cpu/avx512_mask.h"
#include "kernels/cpu/lane_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
#define KESTREL_AVX2 __attribute__((target("avx2,fma")))

namespace kestrel::kernels {
namespace {

inline float lane_sum(const float* a) {
  float r8[8], r4[4];
  for (int i = 0; i < 8; ++i) r8[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) r4[i] = r8[i] + r8[i + 4];
  return (r4[0] + r4[2]) + (r4[1] + r4[3]);
}

}  // namespace

// The lane_sum tree in vector steps: (l, l + 8), (l, l + 4), (0, 2) and (1, 3), then the two.
KESTREL_AVX512 float lane_sum_avx512(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));  // lanes 0, 1: q0 + q2, q1 + q3
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1)));
}

// The same tree from two 8-lane halves: (l, l + 8) is lo + hi, then as above.
KESTREL_AVX2 float lane_sum_avx2(__m256 lo, __m256 hi) {
  const __m256 h = _mm256_add_ps(lo, hi);
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));  // lanes 0, 1: q0 + q2, q1 + q3
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1)));
}

namespace {

KESTREL_AVX512 void lane_dot4_avx512(const float* x, const float* const* rows, int64_t n, float* out) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t w = 0;
  for (; 16 * w + 16 <= n; ++w) {
    const __m512 xv = _mm512_loadu_ps(x + 16 * w);
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(rows[r] + 16 * w), acc[r]);
  }
  if (16 * w < n) {  // tail: lanes past n keep their accumulator untouched
    const __mmask16 mk = lanes(n, w);
    const __m512 xv = _mm512_maskz_loadu_ps(mk, x + 16 * w);
    for (int r = 0; r < 4; ++r)
      acc[r] = _mm512_mask3_fmadd_ps(xv, _mm512_maskz_loadu_ps(mk, rows[r] + 16 * w), acc[r], mk);
  }
  for (int r = 0; r < 4; ++r) out[r] = lane_sum_avx512(acc[r]);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace

// Lanes 0–7 and 8–15 of each row's accumulator in two ymm halves; the tail's lanes past n left untouched.
KESTREL_AVX2 void lane_dot4_avx2(const float* x, const float* const* rows, int64_t n, float* out) {
  KCHECK(has_avx2(), "lane_dot4_avx2: this CPU lacks AVX2 or FMA");
  __m256 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  int64_t w = 0;
  for (; 16 * w + 16 <= n; ++w)
    for (int h = 0; h < 2; ++h) {
      const __m256 xv = _mm256_loadu_ps(x + 16 * w + 8 * h);
      for (int r = 0; r < 4; ++r) acc[r][h] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(rows[r] + 16 * w + 8 * h), acc[r][h]);
    }
  if (16 * w < n)
    for (int h = 0; h < 2; ++h) {
      const __m256i mk = lanes8(n - 16 * w, h);
      const __m256 xv = _mm256_maskload_ps(x + 16 * w + 8 * h, mk);
      for (int r = 0; r < 4; ++r) {
        const __m256 f = _mm256_fmadd_ps(xv, _mm256_maskload_ps(rows[r] + 16 * w + 8 * h, mk), acc[r][h]);
        acc[r][h] = _mm256_blendv_ps(acc[r][h], f, _mm256_castsi256_ps(mk));
      }
    }
  for (int r = 0; r < 4; ++r) out[r] = lane_sum_avx2(acc[r][0], acc[r][1]);
}

float lane_dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  for (int64_t d = 0; d < n; ++d) acc[d % 16] = std::fma(a[d], b[d], acc[d % 16]);
  return lane_sum(acc);
}

void lane_dot4(const float* x, const float* const* rows, int64_t n, float* out) {
  if (has_avx512()) return lane_dot4_avx512(x, rows, n, out);
  if (has_avx2()) return lane_dot4_avx2(x, rows, n, out);
  for (int r = 0; r < 4; ++r) out[r] = lane_dot(x, rows[r], n);
}

}  // namespace kestrel::kernels
