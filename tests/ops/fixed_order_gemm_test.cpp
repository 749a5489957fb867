// The fixed-order fp32 GEMM (kernels/cpu/fixed_order_gemm.h): every element equals its definition, one std::fma
// chain over k in order from 0, bit for bit, at every edge of the micro-tile (rows 1–13, columns 1–40 across the
// 16-column panels), of the K blocks (255, 256, 257, 600) and the row blocks (T up to 200), with leading dimensions
// wider than the matrix; and the rows it writes do not depend on T or on which rows come before them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/fixed_order_gemm.h"

namespace kestrel::kernels {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> pack(const std::vector<float>& B, int64_t N, int64_t K) {
  std::vector<float> packed(static_cast<size_t>(fixed_gemm_packed_floats(N, K)), 123.0f);  // junk where zeros belong
  for (int64_t n = 0; n < N; ++n) fixed_gemm_pack_row(B.data() + n * K, n, K, packed.data());
  fixed_gemm_pack_zero_rows(N, K, packed.data());
  return packed;
}

// y[t][n] = fma(x[t][K-1], B[n][K-1], ... fma(x[t][0], B[n][0], 0)).
float definition(const float* x, const float* b, int64_t K) {
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) acc = std::fma(x[k], b[k], acc);
  return acc;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(FixedOrderGemm, EveryElementIsItsFmaChainAtEveryEdge) {
  for (int64_t K : {1, 7, 255, 256, 257, 600}) {
    for (int64_t T : {1, 5, 6, 7, 13, 97, 200}) {
      for (int64_t N : {1, 15, 16, 17, 40}) {
        const int64_t ldx = K + 3, ldy = N + 5;
        const auto x = random_floats(static_cast<size_t>(T * ldx), static_cast<uint32_t>(K * 131 + T));
        const auto B = random_floats(static_cast<size_t>(N * K), static_cast<uint32_t>(N * 7 + K));
        const auto packed = pack(B, N, K);
        std::vector<float> y(static_cast<size_t>(T * ldy), -7.0f);
        fixed_order_gemm(T, N, K, x.data(), ldx, packed.data(), y.data(), ldy);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t n = 0; n < N; ++n) {
            const float want = definition(x.data() + t * ldx, B.data() + n * K, K);
            ASSERT_TRUE(same_bits(y[static_cast<size_t>(t * ldy + n)], want))
                << "T " << T << " N " << N << " K " << K << " at (" << t << ", " << n << "): "
                << y[static_cast<size_t>(t * ldy + n)] << " vs " << want;
          }
          for (int64_t n = N; n < ldy; ++n)
            ASSERT_EQ(y[static_cast<size_t>(t * ldy + n)], -7.0f) << "wrote past column " << N;
        }
      }
    }
  }
}

TEST(FixedOrderGemm, RowsDoNotDependOnTheBatch) {
  const int64_t K = 300, N = 50, T = 150;
  const auto x = random_floats(static_cast<size_t>(T * K), 5);
  const auto packed = pack(random_floats(static_cast<size_t>(N * K), 6), N, K);
  std::vector<float> all(static_cast<size_t>(T * N));
  fixed_order_gemm(T, N, K, x.data(), K, packed.data(), all.data(), N);
  for (int64_t t0 : {0, 1, 5, 95, 96, 149}) {
    std::vector<float> one(static_cast<size_t>(N));
    fixed_order_gemm(1, N, K, x.data() + t0 * K, K, packed.data(), one.data(), N);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + t0 * N, static_cast<size_t>(N) * sizeof(float)), 0) << "row " << t0;
  }
}

}  // namespace
}  // namespace kestrel::kernels
