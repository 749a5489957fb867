// Dot products in one fixed order, so that a vector form and its scalar definition give the same bits:
// lane l (0..15) accumulates fma(a[d], b[d], ·) for d ≡ l (mod 16), d ascending, and the 16 lanes are summed
// in a tree of halves ((l, l + 8), then (l, l + 4), then (0, 2) and (1, 3), then the two). The result depends
// only on the two vectors, not on which or how many other products run beside it.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kestrel::kernels {

// The definition, scalar.
float lane_dot(const float* a, const float* b, int64_t n);
// out[r] = lane_dot(x, rows[r], n) for r < 4, the four sharing each load of x (AVX-512 when the CPU has it,
// else AVX2 + FMA when it has that).
void lane_dot4(const float* x, const float* const* rows, int64_t n, float* out);
// The AVX2 + FMA form whatever else the CPU has (for tests); the CPU must have AVX2 + FMA.
void lane_dot4_avx2(const float* x, const float* const* rows, int64_t n, float* out);

// The lane sum of a 16-lane accumulator, in the order above (for AVX-512 kernels that accumulate as lane_dot).
__attribute__((target("avx512f,avx512dq,fma"))) float lane_sum_avx512(__m512 v);
// The same for AVX2 kernels, the 16 lanes as two halves: lanes 0–7 in lo, 8–15 in hi.
__attribute__((target("avx2,fma"))) float lane_sum_avx2(__m256 lo, __m256 hi);

}  // namespace kestrel::kernels
