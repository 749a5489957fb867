// The KDA chunk kernel's product helpers (src/kernels/cpu/kda_gemm.h) against plain fp64 loops, at sizes that
// are not multiples of the register tiles or of the vector width (M, N, Kd of 1, 3, 5, 7, 13, 33, …), with
// leading dimensions wider than the sizes (the cells between must stay untouched) and both layouts of A.
// Tolerance: an fp32 chain of Kd fused multiply-adds (plus the lane tree of gram_nt) has an error of at most
// (Kd + 16)·u·Σ|terms| (u = 2^-24); we assert that bound. Wrong strides, a skipped row/column/term or a stale
// accumulator give errors of the order of the terms themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kda_gemm.h"

namespace kestrel {
namespace {

constexpr float kSentinel = 12345.0f;
constexpr double kU = 1.0 / (1 << 24);

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

TEST(KdaGemm, GemmAccMatchesFp64) {
  std::mt19937 rng(17);
  int cases = 0;
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 13, 64}) {
    for (int64_t N : {1, 7, 8, 12, 16, 24, 33, 128}) {
      for (int64_t Kd : {1, 3, 16, 37, 128}) {
        for (bool transposed : {false, true}) {
          // A(i, p) = A[i·a_rs + p·a_ps]; the stored matrix has 3 spare entries per row.
          const int64_t lda = (transposed ? M : Kd) + 3;
          const int64_t a_rs = transposed ? 1 : lda, a_ps = transposed ? lda : 1;
          const int64_t ldb = N + 5, ldc = N + 2;
          const std::vector<float> A = randn(static_cast<size_t>(lda * (transposed ? Kd : M)), rng);
          const std::vector<float> B = randn(static_cast<size_t>(ldb * Kd), rng);
          std::vector<float> C = randn(static_cast<size_t>(ldc * M), rng);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t n = N; n < ldc; ++n) C[i * ldc + n] = kSentinel;
          const std::vector<float> C0 = C;
          kernels::kda::gemm_acc(M, N, Kd, A.data(), a_rs, a_ps, B.data(), ldb, C.data(), ldc);
          const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " Kd=" +
                                   std::to_string(Kd) + (transposed ? " At" : " A");
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t n = 0; n < N; ++n) {
              double ref = C0[i * ldc + n], mag = std::fabs(ref);
              for (int64_t p = 0; p < Kd; ++p) {
                const double t = static_cast<double>(A[i * a_rs + p * a_ps]) * B[p * ldb + n];
                ref += t;
                mag += std::fabs(t);
              }
              ASSERT_LE(std::fabs(C[i * ldc + n] - ref), (Kd + 16) * kU * mag) << what << " at " << i << "," << n;
            }
            for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(C[i * ldc + n], kSentinel) << what << " pad " << i << "," << n;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 10 * 8 * 5 * 2);
}

TEST(KdaGemm, GramNtMatchesFp64) {
  std::mt19937 rng(23);
  for (int64_t M : {1, 3, 4, 5, 9, 32, 33}) {
    for (int64_t N : {1, 2, 3, 5, 8, 31, 32}) {
      for (int64_t Kd : {1, 5, 8, 16, 17, 128}) {
        const int64_t lda = Kd + 2, ldb = Kd + 7, ldg = N + 3;
        const std::vector<float> A = randn(static_cast<size_t>(lda * M), rng);
        const std::vector<float> B = randn(static_cast<size_t>(ldb * N), rng);
        std::vector<float> G(static_cast<size_t>(ldg * M), kSentinel);
        kernels::kda::gram_nt(M, N, Kd, A.data(), lda, B.data(), ldb, G.data(), ldg);
        const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " Kd=" + std::to_string(Kd);
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            double ref = 0.0, mag = 0.0;
            for (int64_t p = 0; p < Kd; ++p) {
              const double t = static_cast<double>(A[i * lda + p]) * B[j * ldb + p];
              ref += t;
              mag += std::fabs(t);
            }
            ASSERT_LE(std::fabs(G[i * ldg + j] - ref), (Kd + 16) * kU * mag) << what << " at " << i << "," << j;
          }
          for (int64_t j = N; j < ldg; ++j) ASSERT_EQ(G[i * ldg + j], kSentinel) << what << " pad " << i << "," << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kestrel
