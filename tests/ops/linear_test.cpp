// Linear kernels: every path (register-blocked decode-then-dot, fused MXFP4 for ≤ 4 tokens, row
// tails) gives each token the same bits whatever the batch size — the scheduler's batch
// invariance rests on this — and agrees with the fp64 scalar reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/linear.h"

namespace kestrel::kernels {
namespace {

struct Mat {
  std::vector<uint8_t> data, scales;
  WeightMatrix w;
};

Mat random_matrix(WeightFormat f, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  Mat m;
  m.w.format = f, m.w.out = out, m.w.in = in;
  if (f == WeightFormat::kMxfp4) {
    m.data.resize(static_cast<size_t>(out * in / 2));
    m.scales.resize(static_cast<size_t>(out * in / 32));
    for (auto& b : m.data) b = static_cast<uint8_t>(rng());
    for (auto& s : m.scales) s = static_cast<uint8_t>(120 + rng() % 8);
    m.w.scales = m.scales.data();
  } else {
    m.data.resize(static_cast<size_t>(out * in * 2));
    std::uniform_real_distribution<float> d(-1, 1);
    for (int64_t i = 0; i < out * in; ++i) {
      const uint16_t v = f32_to_bf16(d(rng));
      std::memcpy(m.data.data() + 2 * i, &v, 2);
    }
  }
  m.w.data = m.data.data();
  return m;
}

class LinearPaths : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(LinearPaths, PerTokenBitsIndependentOfBatchAndMatchReference) {
  const int64_t out = 37, in = 96, T = 9;  // odd row count: exercises row tails
  Mat m = random_matrix(GetParam(), out, in, 7);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = d(rng);
  std::vector<float> full(static_cast<size_t>(T * out)), ref(static_cast<size_t>(T * out));
  matmul(m.w, x.data(), T, full.data());
  matmul_reference(m.w, x.data(), T, ref.data());
  for (int64_t n = 1; n <= T; ++n) {  // every batch size, every position
    std::vector<float> part(static_cast<size_t>(n * out));
    matmul(m.w, x.data(), n, part.data());
    for (int64_t i = 0; i < n * out; ++i) ASSERT_EQ(part[static_cast<size_t>(i)], full[static_cast<size_t>(i)]) << "n " << n << " i " << i;
  }
  for (int64_t i = 0; i < T * out; ++i) {
    const double tol = 1e-5 * (std::fabs(ref[static_cast<size_t>(i)]) + 1.0);
    EXPECT_NEAR(full[static_cast<size_t>(i)], ref[static_cast<size_t>(i)], tol);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearPaths, ::testing::Values(WeightFormat::kBF16, WeightFormat::kMxfp4));

}  // namespace
}  // namespace kestrel::kernels
