// lane_dot.h: the scalar definition and its AVX-512 form.
#include "kernels/cpu/lane_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#define KESTREL_AVX512 __attribute__((target("avx512f,fma")))

namespace kestrel::kernels {
namespace {

inline float lane_sum(const float* a) {
  float r8[8], r4[4];
  for (int i = 0; i < 8; ++i) r8[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) r4[i] = r8[i] + r8[i + 4];
  return (r4[0] + r4[2]) + (r4[1] + r4[3]);
}

inline __mmask16 lanes(int64_t n, int64_t w) {
  const int64_t k = std::clamp<int64_t>(n - 16 * w, 0, 16);
  return static_cast<__mmask16>((1u << k) - 1u);
}

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
  alignas(64) float l16[16];
  for (int r = 0; r < 4; ++r) {
    _mm512_store_ps(l16, acc[r]);
    out[r] = lane_sum(l16);
  }
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
