// What the AVX2 + FMA kernels that state their bits lane by lane share: the lane mask of a row's tail, and a
// way to keep a loaded vector in its register.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kestrel::kernels {

// Lanes [8w, 8w + 8) of a row of n floats, as a maskload / maskstore / blendv mask.
__attribute__((target("avx2"))) inline __m256i lanes8(int64_t n, int64_t w) {
  const int32_t k = static_cast<int32_t>(std::clamp<int64_t>(n - 8 * w, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace kestrel::kernels

// Keeps a loaded vector in its register: without it GCC folds the load into every FMA that uses it (one load
// per FMA instead of one per vector, more loads than the load ports sustain).
#define KESTREL_IN_REGISTER(x) __asm__("" : "+x"(x))
