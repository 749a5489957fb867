// Linear kernels: every path (register-blocked decode-then-dot, fused MXFP4 for ≤ 4 tokens, row
// tails) gives each token the same bits whatever the batch size — the scheduler's batch
// invariance rests on this — and agrees with the fp64 scalar reference; and every path keeps the
// fixed summation order (16-lane partial sums, lane sum 0..15 from +0, scalar tail) bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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

// A float drawn to stress summation order: ±0, denormals, and normals over a wide exponent range
// (no inf/nan, no overflow of any product or sum at these sizes).
float nasty_float(std::mt19937& rng, int max_exp) {
  const uint32_t kind = rng() % 16, sign = (rng() & 1u) << 31;
  uint32_t bits;
  if (kind == 0) bits = 0;                                 // ±0
  else if (kind == 1) bits = rng() & 0x7FFFFFu;            // denormal
  else bits = (static_cast<uint32_t>(127 - max_exp + static_cast<int>(rng() % static_cast<uint32_t>(2 * max_exp))) << 23) | (rng() & 0x7FFFFFu);
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The kernels' documented order, written out in scalar code: per (row, token) 16-lane partial sums
// over the row in steps of 16 (one FMA per element where the target has FMA: the kernels' vector
// `acc += w * x` is contracted under -ffp-contract=fast), lane sum 0..15 starting from +0, then the
// scalar tail, each product rounded before it is added.
float fixed_order_dot(const float* w, const float* x, int64_t n) {
  float a[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) {
#if defined(__FMA__)
      a[k] = std::fma(w[i + k], x[i + k], a[k]);
#else
      volatile float p = w[i + k] * x[i + k];
      a[k] = a[k] + p;
#endif
    }
  float s = 0;
  for (int k = 0; k < 16; ++k) s += a[k];
  for (; i < n; ++i) {
    volatile float p = w[i] * x[i];
    s = s + p;
  }
  return s;
}

class LinearOrder : public ::testing::TestWithParam<WeightFormat> {};

// Every kernel shape — fused few-token paths (T ≤ 4: U = 1..4), many-token tiles (4 rows × 4 tokens, or
// 4 × 3 on AVX2, and their row / token tails), row panels (out = 70 and 131: more than one panel, the last
// one ragged), rows longer than a K-block (in 1040, 2100) over one and two token blocks, every tail of `in` mod 16 —
// equals the scalar formula bit for bit.
TEST_P(LinearOrder, EveryShapeMatchesScalarFormulaBitwise) {
  const WeightFormat f = GetParam();
  std::vector<int64_t> ins;
  if (f == WeightFormat::kMxfp4) {
    ins = {32, 64, 96, 384};
  } else {
    for (int64_t t = 0; t < 16; ++t) ins.push_back(384 + t);
    for (int64_t n : {1, 7, 15, 16, 17, 31, 33, 48, 1040, 2100}) ins.push_back(n);  // (> 1024: K-blocks on AVX2)
  }
  std::mt19937 rng(11);
  for (const int64_t in : ins)
    for (const int64_t out : {1, 3, 4, 5, 9, 70, 131}) {
      Mat m;
      m.w.format = f, m.w.out = out, m.w.in = in;
      if (f == WeightFormat::kMxfp4) {
        m.data.resize(static_cast<size_t>(out * in / 2));
        m.scales.resize(static_cast<size_t>(out * in / 32));
        for (auto& b : m.data) b = static_cast<uint8_t>(rng());
        for (auto& sc : m.scales) sc = static_cast<uint8_t>(100 + rng() % 50);
        m.w.scales = m.scales.data();
      } else {
        const size_t bytes = f == WeightFormat::kF32 ? 4 : 2;
        m.data.resize(static_cast<size_t>(out * in) * bytes);
        for (int64_t i = 0; i < out * in; ++i) {
          const float v = nasty_float(rng, 12);
          if (f == WeightFormat::kF32) {
            std::memcpy(m.data.data() + 4 * i, &v, 4);
          } else {
            uint16_t h = f == WeightFormat::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
            if (f == WeightFormat::kF16 && rng() % 16 == 0) h = static_cast<uint16_t>((rng() & 0x8000u) | (rng() & 0x3FFu));  // f16 denormal
            std::memcpy(m.data.data() + 2 * i, &h, 2);
          }
        }
      }
      m.w.data = m.data.data();
      std::vector<float> rows(static_cast<size_t>(out * in));
      for (int64_t r = 0; r < out; ++r) decode_row(m.w, r, rows.data() + r * in);
      for (const int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 11, 16, 29}) {  // (29: two token blocks of the K-blocked form)
        std::vector<float> x(static_cast<size_t>(T * in));
        for (auto& v : x) v = nasty_float(rng, 12);
        const int64_t ldy = out + 3;
        std::vector<float> y(static_cast<size_t>(T * ldy), 12345.0f);
        matmul_rows(m.w, x.data(), T, y.data(), ldy, 0, out);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < out; ++r) {
            const float want = fixed_order_dot(rows.data() + r * in, x.data() + t * in, in);
            const float got = y[static_cast<size_t>(t * ldy + r)];
            uint32_t wb, gb;
            std::memcpy(&wb, &want, 4);
            std::memcpy(&gb, &got, 4);
            ASSERT_EQ(gb, wb) << "in " << in << " out " << out << " T " << T << " t " << t << " r " << r << ": " << got << " vs " << want;
          }
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = out; r < ldy; ++r) ASSERT_EQ(y[static_cast<size_t>(t * ldy + r)], 12345.0f);  // nothing past out
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearOrder,
                         ::testing::Values(WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kF16, WeightFormat::kMxfp4));

}  // namespace
}  // namespace kestrel::kernels
