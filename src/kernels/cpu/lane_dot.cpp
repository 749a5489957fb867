// lane_dot.h: the scalar definition and its AVX-512 form.
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/avx512_mask.h"
#include "kernels/cpu/lane_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512dq,fma")))

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

}  // namespace

float lane_dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  for (int64_t d = 0; d < n; ++d) acc[d % 16] = std::fma(a[d], b[d], acc[d % 16]);
  return lane_sum(acc);
}

void lane_dot4(const float* x, const float* const* rows, int64_t n, float* out) {
  if (has_avx512()) return lane_dot4_avx512(x, rows, n, out);
  for (int r = 0; r < 4; ++r) out[r] = lane_dot(x, rows[r], n);
}

}  // namespace kestrel::kernels
