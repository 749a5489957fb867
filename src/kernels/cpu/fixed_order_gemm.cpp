// The fixed-order fp32 GEMM (fixed_order_gemm.h): B packing, the 6 × 16 micro-tile (AVX2 + FMA, or a portable
// loop of std::fma with the same chains), and the K / row / panel blocking.
#include "kernels/cpu/fixed_order_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace kestrel::kernels {

namespace {

constexpr int64_t kRows = 6;        // rows of a micro-tile (12 ymm accumulators with its 16 columns)
constexpr int64_t kKBlock = 256;    // K per pass: a panel's block is 16 KiB (L1)
constexpr int64_t kRowBlock = 96;   // rows per pass over the panels: 96 KiB of x per K block (L2)

// c[r][0..16) (leading dimension ldc) = the chains of R rows of x over k in [k0, k1), continued from c (or from 0
// when `first`), against one packed panel.
#if defined(__AVX2__) && defined(__FMA__)
template <int R>
void tile(const float* x, int64_t ldx, const float* panel, int64_t k0, int64_t k1, float* c, int64_t ldc, bool first) {
  // Every loop over acc is unrolled: otherwise GCC 12 keeps the accumulators on the stack.
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc);
    acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc + 8);
  }
  for (int64_t k = k0; k < k1; ++k) {
    const __m256 b0 = _mm256_loadu_ps(panel + k * kFixedGemmPanel), b1 = _mm256_loadu_ps(panel + k * kFixedGemmPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}
#else
template <int R>
void tile(const float* x, int64_t ldx, const float* panel, int64_t k0, int64_t k1, float* c, int64_t ldc, bool first) {
  float acc[R][kFixedGemmPanel];
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < kFixedGemmPanel; ++j) acc[r][j] = first ? 0.0f : c[r * ldc + j];
  for (int64_t k = k0; k < k1; ++k)
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < kFixedGemmPanel; ++j)
        acc[r][j] = std::fma(x[r * ldx + k], panel[k * kFixedGemmPanel + j], acc[r][j]);
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < kFixedGemmPanel; ++j) c[r * ldc + j] = acc[r][j];
}
#endif

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);
constexpr TileFn kTiles[kRows] = {&tile<1>, &tile<2>, &tile<3>, &tile<4>, &tile<5>, &tile<6>};

}  // namespace

void fixed_gemm_pack_row(const float* row, int64_t n, int64_t K, float* packed) {
  float* dst = packed + n / kFixedGemmPanel * kFixedGemmPanel * K + n % kFixedGemmPanel;
  for (int64_t k = 0; k < K; ++k) dst[k * kFixedGemmPanel] = row[k];
}

void fixed_gemm_pack_zero_rows(int64_t N, int64_t K, float* packed) {
  const int64_t last = N / kFixedGemmPanel, used = N % kFixedGemmPanel;
  if (used == 0) return;
  float* base = packed + last * kFixedGemmPanel * K;
  for (int64_t k = 0; k < K; ++k) std::fill(base + k * kFixedGemmPanel + used, base + (k + 1) * kFixedGemmPanel, 0.0f);
}

void fixed_order_gemm(int64_t T, int64_t N, int64_t K, const float* x, int64_t ldx, const float* packed, float* y,
                      int64_t ldy) {
  if (T <= 0 || N <= 0) return;
  const int64_t panels = (N + kFixedGemmPanel - 1) / kFixedGemmPanel;
  if (K <= 0) {
    for (int64_t t = 0; t < T; ++t) std::fill(y + t * ldy, y + t * ldy + N, 0.0f);
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
    const int64_t k1 = std::min(K, k0 + kKBlock);
    const bool first = k0 == 0;
    for (int64_t m0 = 0; m0 < T; m0 += kRowBlock) {
      const int64_t m1 = std::min(T, m0 + kRowBlock);
      for (int64_t p = 0; p < panels; ++p) {
        const float* panel = packed + p * kFixedGemmPanel * K;
        const int64_t n0 = p * kFixedGemmPanel, cols = std::min(kFixedGemmPanel, N - n0);
        for (int64_t i = m0; i < m1; i += kRows) {
          const int64_t rows = std::min(kRows, m1 - i);
          const TileFn fn = kTiles[rows - 1];
          if (cols == kFixedGemmPanel) {
            fn(x + i * ldx, ldx, panel, k0, k1, y + i * ldy + n0, ldy, first);
            continue;
          }
          // The last, narrower panel: through a full-width tile (its zero columns are computed and dropped).
          float edge[kRows * kFixedGemmPanel];
          if (!first)
            for (int64_t r = 0; r < rows; ++r)
              std::memcpy(edge + r * kFixedGemmPanel, y + (i + r) * ldy + n0, static_cast<size_t>(cols) * sizeof(float));
          fn(x + i * ldx, ldx, panel, k0, k1, edge, kFixedGemmPanel, first);
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(y + (i + r) * ldy + n0, edge + r * kFixedGemmPanel, static_cast<size_t>(cols) * sizeof(float));
        }
      }
    }
  }
}

}  // namespace kestrel::kernels
