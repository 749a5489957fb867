// BF16 weights × bf16-rounded activations (kernels/cpu/bf16_dot.h):
// - the activation rounding equals the CPU's own fp32→bf16 conversion (vcvtne2ps2bf16, round to
//   nearest even), ties and NaN included — the rounding llama.cpp applies to activations before
//   BF16 products (ggml_compute_fp32_to_bf16);
// - the AVX512-BF16 kernel equals the fp64 dot of the bf16 weights and the bf16-rounded activations
//   within fp32 summation error (2e-6 · Σ|w·x|), and its scalar model;
// - every token and row gets the same bits at any batch size and row split;
// - matmul() takes this path for a matrix flagged act_bf16 in the default GGUF mode, and the exact
//   fp32 path otherwise (unflagged, or KESTREL_GGUF_INT8 off).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <random>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/gguf_int8.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

__attribute__((target("avx512f,avx512bf16,avx512vl"))) void hw_round(const float* x, uint16_t* out) {
  const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
  _mm512_storeu_si512(out, (__m512i)v);
}

TEST(Bf16Dot, ActivationRoundingMatchesTheCpu) {
  if (!cpu_has_avx512bf16()) GTEST_SKIP() << "CPU has no AVX512-BF16 (the path is off there)";
  std::mt19937 rng(3);
  std::vector<float> x(32 * 64);
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    if (i % 4 == 2) u = (u & 0xffff0000u) | 0x7fffu;
    if (i % 97 == 0) u = 0x7fc00001u;  // NaN
    if ((u & 0x7f800000u) == 0) u |= 0x00800000u;  // no subnormals (vcvtne2ps2bf16 flushes them)
    x[i] = std::bit_cast<float>(u);
  }
  Bf16Acts a;
  bf16_acts_prepare(a, 64, 32);
  bf16_acts_fill(x.data(), 0, 64, a);
  std::vector<uint16_t> hw(x.size());
  for (size_t i = 0; i < x.size(); i += 32) hw_round(x.data() + i, hw.data() + i);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(a.x[i]))) << i;
      continue;
    }
    ASSERT_EQ(a.x[i], hw[i]) << "element " << i << " value " << x[i];
  }
}

class Bf16DotKernel : public ::testing::TestWithParam<int64_t> {};

TEST_P(Bf16DotKernel, MatchesFp64AndIsBatchInvariant) {
  if (!cpu_has_avx512bf16()) GTEST_SKIP() << "CPU has no AVX512-BF16 (the path is off there)";
  // 16416-wide rows: the prefill token blocks hold 12 tokens (≈ 512 KiB of activations), so T = 30
  // crosses two block boundaries and ends in a 4 + 1 + 1 tail.
  const int64_t in = GetParam(), out = 37, T = in > 8192 ? 30 : 9;
  std::mt19937 rng(static_cast<unsigned>(in));
  std::normal_distribution<float> nd(0, 1);
  std::vector<uint16_t> wd(static_cast<size_t>(out * in));
  for (auto& v : wd) v = static_cast<uint16_t>(std::bit_cast<uint32_t>(nd(rng)) >> 16);
  WeightMatrix w;
  w.format = WeightFormat::kBF16, w.out = out, w.in = in, w.data = wd.data(), w.act_bf16 = true;
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = nd(rng);
  Bf16Acts a;
  bf16_acts_prepare(a, T, in);
  bf16_acts_fill(x.data(), 0, T, a);

  std::vector<float> y(static_cast<size_t>(T * out)), yr(y.size());
  bf16_dot_rows(w, a, y.data(), out, 0, out);
  bf16_dot_rows_reference(w, a, yr.data(), out, 0, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < out; ++r) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = static_cast<double>(bf16_to_f32(wd[static_cast<size_t>(r * in + k)])) *
                         bf16_to_f32(a.x[static_cast<size_t>(t * a.stride + k)]);
        s += p, m += std::fabs(p);
      }
      const size_t i = static_cast<size_t>(t * out + r);
      ASSERT_NEAR(y[i], s, 2e-6 * m + 1e-30) << "kernel vs fp64, t " << t << " r " << r;
      ASSERT_NEAR(yr[i], s, 2e-6 * m + 1e-30) << "scalar model vs fp64, t " << t << " r " << r;
    }

  for (int64_t t = 0; t < T; ++t) {  // one token alone, rows cut at odd places: the same bits
    Bf16Acts one;
    bf16_acts_prepare(one, 1, in);
    bf16_acts_fill(x.data() + t * in, 0, 1, one);
    std::vector<float> y1(static_cast<size_t>(out));
    bf16_dot_rows(w, one, y1.data(), out, 0, 5);
    bf16_dot_rows(w, one, y1.data(), out, 5, 6);
    bf16_dot_rows(w, one, y1.data(), out, 6, out);
    for (int64_t r = 0; r < out; ++r) ASSERT_EQ(y1[static_cast<size_t>(r)], y[static_cast<size_t>(t * out + r)]) << t << " " << r;
  }

  // matmul(): flagged + GGUF mode on → this kernel (bitwise); mode off or unflagged → exact fp32 path.
  std::vector<float> ym(y.size()), exact(y.size());
  set_gguf_int8(true);
  matmul(w, x.data(), T, ym.data());
  EXPECT_EQ(ym, y);
  matmul_reference(w, x.data(), T, exact.data());
  set_gguf_int8(false);
  matmul(w, x.data(), T, ym.data());
  for (size_t i = 0; i < ym.size(); ++i) ASSERT_NEAR(ym[i], exact[i], 1e-4 * (std::fabs(exact[i]) + 1)) << "mode off " << i;
  set_gguf_int8(true);
  w.act_bf16 = false;
  matmul(w, x.data(), T, ym.data());
  for (size_t i = 0; i < ym.size(); ++i) ASSERT_NEAR(ym[i], exact[i], 1e-4 * (std::fabs(exact[i]) + 1)) << "unflagged " << i;
}

INSTANTIATE_TEST_SUITE_P(Widths, Bf16DotKernel, ::testing::Values(32, 48, 512, 2304, 16416));

}  // namespace
}  // namespace kestrel::kernels
