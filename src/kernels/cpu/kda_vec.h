// Fixed-width fp32 vectors for the KDA chunk kernels, written with the GCC/Clang vector extensions so that one
// source serves every instruction set: 16 lanes where AVX-512 is enabled, 8 otherwise (the compiler splits a
// vector wider than the target's registers, e.g. into SSE halves). KESTREL_KDA_VEC_BYTES overrides the width
// (tests build the same kernels at other widths). Loads and stores are unaligned; the lane sum has one fixed
// order, so a result never depends on where a buffer sits in memory.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#ifndef KESTREL_KDA_VEC_BYTES
#if defined(__AVX512F__)
#define KESTREL_KDA_VEC_BYTES 64
#else
#define KESTREL_KDA_VEC_BYTES 32
#endif
#endif

namespace kestrel::kernels::kda {

typedef float vf __attribute__((vector_size(KESTREL_KDA_VEC_BYTES)));
typedef int32_t vi __attribute__((vector_size(KESTREL_KDA_VEC_BYTES)));

inline constexpr int64_t kLanes = KESTREL_KDA_VEC_BYTES / 4;

inline vf splat(float x) { return vf{} + x; }

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }

// Sum of the lanes as a pairwise tree (lane i + lane i + w for w = kLanes/2, …, 1).
inline float hsum(vf v) {
  float t[kLanes];
  std::memcpy(t, &v, sizeof(vf));
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

// exp(x) for x <= 0, lane by lane: Cephes-style range reduction and a degree-6 polynomial (~1-2 ulp); exactly 0
// below the smallest normal result (x < -87.3). x > 0 is not supported (the KDA kernels never form it).
inline vf exp_nonpos(vf x) {
  const vi under = x < splat(-87.3f);
  x = under ? splat(-87.3f) : x;
  // Round-to-nearest via the 1.5*2^23 trick (valid for |x*log2e| < 2^22).
  const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  vf r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;  // n in [-126, 0]
  return under ? vf{} : p * std::bit_cast<vf>(e);
}

}  // namespace kestrel::kernels::kda
