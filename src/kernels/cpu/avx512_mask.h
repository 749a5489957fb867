// The lane mask of a row of floats taken 16 at a time by AVX-512 kernels (masked loads and stores).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kestrel::kernels {

// Lanes [16w, 16w + 16) of a row of n floats.
inline __mmask16 lanes(int64_t n, int64_t w) {
  const int64_t k = std::clamp<int64_t>(n - 16 * w, 0, 16);
  return static_cast<__mmask16>((1u << k) - 1u);
}

}  // namespace kestrel::kernels
