// The vision tower's fp32 kernels: matmul_sgemm / sgemm over OpenBLAS (kernels/cpu/blas_gemm.h) and the
// elementwise helper it uses (gelu_tanh_inplace in kernels/cpu/elementwise.h):
// - matmul_sgemm equals the fp64 product of the same fp32 / bf16 weights within fp32 summation error
//   (4e-6 · Σ|w·x|), also when the bf16 weight is decoded in several slices of rows;
// - a row of y has the same bits whatever the batch around it (T from 1 to 1,400, the row first or after others),
//   at the tower's real widths and at tiny widths where OpenBLAS would otherwise switch to its small-matrix
//   kernels (M·N·K ≤ 10^6; without the padding these rows differ), and the same bits run to run;
// - the bits do not depend on the thread count, and the GELU epilogue equals the product then a GELU pass;
// - gelu_tanh_inplace equals its fp64 definition within a few ulp (libmvec tanhf).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/elementwise.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Bf16Weight {
  std::vector<uint16_t> bits;
  WeightMatrix m;
};
Bf16Weight bf16_weight(int64_t out, int64_t in, uint32_t seed) {
  Bf16Weight w;
  for (float v : random_floats(static_cast<size_t>(out * in), seed)) w.bits.push_back(f32_to_bf16(v));
  w.m = {WeightFormat::kBF16, out, in, w.bits.data()};
  return w;
}

void expect_matches_fp64(const WeightMatrix& w, const float* x, int64_t T, const std::vector<float>& y) {
  std::vector<float> row(static_cast<size_t>(w.in));
  for (int64_t r = 0; r < w.out; ++r) {
    decode_row(w, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < w.in; ++k) {
        exact += static_cast<double>(row[static_cast<size_t>(k)]) * x[t * w.in + k];
        mag += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * x[t * w.in + k]);
      }
      ASSERT_NEAR(y[static_cast<size_t>(t * w.out + r)], exact, 4e-6 * mag) << "row " << r << " token " << t;
    }
  }
}

TEST(BlasGemm, MatchesTheFp64Product) {
  const int64_t T = 37;
  const std::vector<float> x = random_floats(static_cast<size_t>(T * 4096), 1);
  const std::vector<float> wf = random_floats(96 * 588, 2);
  const WeightMatrix f32{WeightFormat::kF32, 96, 588, wf.data()};
  std::vector<float> y(static_cast<size_t>(T * 96));
  matmul_sgemm(f32, x.data(), T, y.data());
  expect_matches_fp64(f32, x.data(), T, y);
  // 1,200 × 4096 bf16: each thread's 600 rows decoded in two slices (≤ 512 rows of 4,096).
  const Bf16Weight b = bf16_weight(1200, 4096, 3);
  ASSERT_GT(b.m.out * b.m.in / 2, kDecodeSliceFloats);
  y.assign(static_cast<size_t>(T * 1200), 0.0f);
  matmul_sgemm(b.m, x.data(), T, y.data());
  expect_matches_fp64(b.m, x.data(), T, y);
}

// Rows [0, T) of x alone, then inside batches of T + extra rows (first, and after the extra rows): same bits.
void expect_batch_invariant(int64_t out, int64_t in) {
  const Bf16Weight w = bf16_weight(out, in, 7);
  const int64_t kMaxRows = 1400 + 700;
  const std::vector<float> pool = random_floats(static_cast<size_t>(kMaxRows * in), 8);
  for (int64_t T : {1, 4, 16, 84, 300, 1400}) {
    std::vector<float> alone(static_cast<size_t>(T * out)), again(alone.size());
    matmul_sgemm(w.m, pool.data(), T, alone.data());
    matmul_sgemm(w.m, pool.data(), T, again.data());
    EXPECT_EQ(alone, again) << "run to run, T " << T;
    for (int64_t extra : {3, 16, 700}) {
      std::vector<float> y(static_cast<size_t>((T + extra) * out));
      matmul_sgemm(w.m, pool.data(), T + extra, y.data());
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin()))
          << out << "x" << in << ": T " << T << " first in a batch of " << T + extra;
      std::vector<float> shifted(static_cast<size_t>((T + extra) * in));
      std::copy(pool.begin() + T * in, pool.begin() + (T + extra) * in, shifted.begin());
      std::copy(pool.begin(), pool.begin() + T * in, shifted.begin() + extra * in);
      matmul_sgemm(w.m, shifted.data(), T + extra, y.data());
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin() + extra * out))
          << out << "x" << in << ": T " << T << " after " << extra << " other rows";
    }
  }
}

TEST(BlasGemm, RowsDoNotDependOnTheBatchAtTheTowerWidths) {
  expect_batch_invariant(4608, 1024);  // q/k/v
  expect_batch_invariant(1024, 4096);  // MLP fc1
}

TEST(BlasGemm, RowsDoNotDependOnTheBatchAtTinyWidths) {
  expect_batch_invariant(64, 48);
  expect_batch_invariant(96, 128);
  expect_batch_invariant(128, 588);
}

// Every product is one single-threaded OpenBLAS call, so the thread count (and with it where the column ranges are
// cut) changes no bit: K = 588 (the patch embedding, between one and two of OpenBLAS's K blocks, where its threaded
// and single-threaded drivers cut K differently), q/k/v and fc1 at the tower widths (fc1's K = 4,096: several decode
// slices per thread), narrow products split by rows (the projector to a 256-wide text model, a tiny width).
TEST(BlasGemm, BitsDoNotDependOnTheThreadCount) {
  const int saved = omp_get_max_threads();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1024, 588}, {4608, 1024}, {1024, 4096}, {256, 4096}, {96, 128}};
  for (const auto& [out, in] : shapes) {
    const Bf16Weight w = bf16_weight(out, in, 9);
    const int64_t T = 1100;
    const std::vector<float> x = random_floats(static_cast<size_t>(T * in), 10);
    std::vector<std::vector<float>> y;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      y.emplace_back(static_cast<size_t>(T * out));
      matmul_sgemm(w.m, x.data(), T, y.back().data());
    }
    EXPECT_EQ(y[0], y[1]) << out << "x" << in << ": 1 vs 2 threads";
    EXPECT_EQ(y[0], y[2]) << out << "x" << in << ": 1 vs 3 threads";
  }
  omp_set_num_threads(saved);
}

// The GELU epilogues give the bits of the product followed by the GELU over all of y (tanh: gelu_tanh_inplace;
// erf: nn.GELU as the projector wrote it), for a product split by columns and a narrow one split by rows.
TEST(BlasGemm, GeluEpiloguesEqualTheSeparatePass) {
  for (const auto& [out, in, T] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{4096, 1024, 700}, {200, 48, 5}}) {
    const Bf16Weight w = bf16_weight(out, in, 11);
    const std::vector<float> x = random_floats(static_cast<size_t>(T * in), 12);
    std::vector<float> plain(static_cast<size_t>(T * out)), tanh_fused(plain.size()), erf_fused(plain.size());
    matmul_sgemm(w.m, x.data(), T, plain.data());
    matmul_sgemm(w.m, x.data(), T, tanh_fused.data(), GemmEpilogue::kGeluTanh);
    matmul_sgemm(w.m, x.data(), T, erf_fused.data(), GemmEpilogue::kGeluErf);
    std::vector<float> tanh_separate = plain, erf_separate = plain;
    gelu_tanh_inplace(tanh_separate.data(), static_cast<int64_t>(tanh_separate.size()));
    for (float& v : erf_separate) v = 0.5f * v * (1.0f + std::erf(v * static_cast<float>(M_SQRT1_2)));
    EXPECT_EQ(tanh_fused, tanh_separate) << out << "x" << in << " T " << T;
    EXPECT_EQ(erf_fused, erf_separate) << out << "x" << in << " T " << T;
    EXPECT_NE(tanh_fused, plain);
    EXPECT_NE(erf_fused, tanh_fused);
  }
}

TEST(VisionElementwise, GeluTanhMatchesFp64) {
  std::vector<float> x = random_floats(70001, 5);
  for (float& v : x) v *= 8.0f;
  const std::vector<float> in = x;
  gelu_tanh_inplace(x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = in[i], g = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(x[i], g, 2e-6 * std::fabs(v) + 1e-7) << "x " << v;
  }
}

}  // namespace
}  // namespace kestrel::kernels
