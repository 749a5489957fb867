// The prefill GEMM form of the AVX-512 VNNI int8-activation kernel (W4A8 int4 groups 32/64/128 and
// MXFP4 × int8; w4a8_prefill_avx512.cpp) against
//   - the small-T kernel, bitwise, for every token at every T = 1..70 with row ranges cut at odd
//     places (batch invariance: a token's output must not depend on T, the row split or the form);
//   - a lane-by-lane scalar model of the arithmetic both forms must perform (written from the
//     format definition: per 128-element chunk, 16 int32 lanes = words of 8 elements, u8 codes with
//     the −c·Σx compensation, one fma per lane and chunk with the lane's group scale, then
//     _mm512_reduce_add_ps's pairing and the token scale), bitwise;
//   - the dispatch: int8_matmul / matmul pick the GEMM form from kInt8GemmMinTokens tokens with the
//     same bits; rows with in % 128 != 0 keep the small-T kernel.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/w4a8_format.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "kernels/cpu/w4a8_isa.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

struct Mat {
  std::vector<uint8_t> packed, scales;
  WeightMatrix w;
};

// Random codes; W4A8 bf16 scales in [0.001, 0.05); MXFP4 E8M0 near 2^-7 plus the edge codes 0, 1
// (subnormal scales) and 254 (2^126) in the first rows.
Mat random_matrix(WeightFormat f, int64_t out, int64_t in, int64_t G, uint32_t seed) {
  std::mt19937 rng(seed);
  Mat m;
  m.w.format = f, m.w.out = out, m.w.in = in, m.w.group = f == WeightFormat::kW4A8 ? G : 0;
  m.packed.resize(static_cast<size_t>(out * in / 2));
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng());
  if (f == WeightFormat::kW4A8) {
    const int64_t n = out * in / G;
    m.scales.resize(static_cast<size_t>(2 * n));
    std::uniform_real_distribution<float> d(0.001f, 0.05f);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t s = f32_to_bf16(d(rng));
      std::memcpy(m.scales.data() + 2 * i, &s, 2);
    }
  } else {
    m.scales.resize(static_cast<size_t>(out * in / 32));
    for (auto& s : m.scales) s = static_cast<uint8_t>(116 + rng() % 12);
    m.scales[0] = 0, m.scales[static_cast<size_t>(in / 32 + 1)] = 1, m.scales[static_cast<size_t>(2 * (in / 32) + 2)] = 254;
  }
  m.w.data = m.packed.data(), m.w.scales = m.scales.data();
  return m;
}

std::vector<float> random_x(int64_t T, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = d(rng);
  return x;
}

// 2·E2M1 of an MXFP4 code (the OCP MX table: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the negatives).
constexpr int kTwiceE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Token t of `a` through row r, lane by lane (in % 128 == 0).
float lane_model(const WeightMatrix& w, const QuantizedActs& a, int64_t r, int64_t t) {
  const bool mx = w.format == WeightFormat::kMxfp4;
  const int64_t in = w.in, G = mx ? 32 : w.group, bias = mx ? 12 : 8;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * (in / 2);
  const uint8_t* sc = static_cast<const uint8_t*>(w.scales) + r * (in / G) * (mx ? 1 : 2);
  const int8_t* q = a.q.data() + t * in;
  float acc[16] = {};
  for (int64_t c = 0; c < in / 128; ++c)
    for (int l = 0; l < 16; ++l) {
      const int64_t k0 = c * 128 + 8 * l;  // the lane's word: elements k0..k0+7
      int32_t p = 0;
      for (int64_t k = k0; k < k0 + 8; ++k) {
        const int code = (row[k / 2] >> (4 * (k % 2))) & 15;
        const int u = mx ? kTwiceE2M1[code] + 12 : code;  // int4: the stored nibble is q + 8
        p += u * q[k] - static_cast<int32_t>(bias) * q[k];
      }
      float s;
      if (mx) {
        s = 0.5f * e8m0_to_f32(sc[k0 / 32]);
      } else {
        uint16_t b;
        std::memcpy(&b, sc + 2 * (k0 / G), 2);
        s = bf16_to_f32(b);
      }
      acc[l] = std::fma(static_cast<float>(p), s, acc[l]);
    }
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = (acc[i + 8] + 0.0f) + (acc[i] + 0.0f);
  for (int i = 0; i < 4; ++i) s4[i] = s8[i + 4] + s8[i];
  return ((s4[0] + s4[2]) + (s4[1] + s4[3])) * a.scale[static_cast<size_t>(t)];
}

uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }

struct Case {
  WeightFormat f;
  int64_t G, in;
};

class Int8Prefill : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
    set_isa_override(Isa::kAvx512Vnni);
  }
  void TearDown() override { set_isa_override(std::nullopt); }
};

TEST_P(Int8Prefill, SameBitsAsSmallTKernelAndLaneModelAtEveryT) {
  const auto [f, G, in] = GetParam();
  const int64_t out = 133, Tmax = 70;  // rows 22..133: a 64-row stripe, then 47 (11 groups of 4, 3 single rows)
  const Mat m = random_matrix(f, out, in, G, static_cast<uint32_t>(in + G));
  std::vector<float> x = random_x(Tmax, in, static_cast<uint32_t>(in));
  for (int64_t k = 0; k < in; ++k) x[static_cast<size_t>(in + k)] = 0;  // token 1 all zero (scale 0)
  std::vector<float> ref(static_cast<size_t>(Tmax * out));
  for (int64_t t = 0; t < Tmax; ++t) {
    QuantizedActs one;
    quantize_activations(x.data() + t * in, 1, in, one);
    int8_matmul_quantized(m.w, one, ref.data() + t * out, Isa::kAvx512Vnni, Int8Form::kSmallT);
    for (int64_t r = 0; r < out; ++r)
      ASSERT_EQ(bits(ref[static_cast<size_t>(t * out + r)]), bits(lane_model(m.w, one, r, 0)))
          << "small-T kernel vs lane model, t " << t << " r " << r;
  }
  QuantizedActs a;
  for (int64_t T = 1; T <= Tmax; ++T) {
    quantize_activations(x.data(), T, in, a);
    std::vector<float> y(static_cast<size_t>(T * out), -1.0f);
    int8_matmul_rows(m.w, a, y.data(), out, 0, 17, Int8Form::kGemm);  // cuts matmul_many never makes (not ×4)
    int8_matmul_rows(m.w, a, y.data(), out, 17, 22, Int8Form::kGemm);
    int8_matmul_rows(m.w, a, y.data(), out, 22, out, Int8Form::kGemm);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(bits(y[static_cast<size_t>(t * out + r)]), bits(ref[static_cast<size_t>(t * out + r)]))
            << "T " << T << " t " << t << " r " << r;
  }
  // The public entries pick the GEMM form from kInt8GemmMinTokens tokens on: the same bits below and above.
  for (const int64_t T : {kInt8GemmMinTokens - 1, kInt8GemmMinTokens, Tmax}) {
    std::vector<float> y(static_cast<size_t>(T * out));
    int8_matmul(m.w, x.data(), T, y.data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(ref[i])) << "int8_matmul T " << T << " i " << i;
    set_mxfp4_int8(true);
    matmul(m.w, x.data(), T, y.data());
    set_mxfp4_int8(false);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(ref[i])) << "matmul T " << T << " i " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Int8Prefill,
                         ::testing::Values(Case{WeightFormat::kW4A8, 32, 128}, Case{WeightFormat::kW4A8, 32, 384},
                                           Case{WeightFormat::kW4A8, 64, 512}, Case{WeightFormat::kW4A8, 128, 2048},
                                           Case{WeightFormat::kMxfp4, 32, 128}, Case{WeightFormat::kMxfp4, 32, 384},
                                           Case{WeightFormat::kMxfp4, 32, 2048}),
                         [](const auto& info) {
                           const Case c = info.param;
                           return (c.f == WeightFormat::kW4A8 ? "w4a8_g" + std::to_string(c.G) : std::string("mxfp4")) + "_in" +
                                  std::to_string(c.in);
                         });

// in % 128 != 0 (a 32-element tail): the automatic choice keeps the small-T kernel at any T; forcing
// the GEMM form fails loudly.
TEST(Int8PrefillTail, TailRowsKeepSmallTKernel) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  const int64_t out = 20, in = 160, T = 40;
  const Mat m = random_matrix(WeightFormat::kW4A8, out, in, 32, 7);
  const std::vector<float> x = random_x(T, in, 8);
  QuantizedActs a;
  quantize_activations(x.data(), T, in, a);
  std::vector<float> y(static_cast<size_t>(T * out)), ref(y.size());
  set_isa_override(Isa::kAvx512Vnni);
  int8_matmul_rows(m.w, a, y.data(), out, 0, out);
  set_isa_override(std::nullopt);
  int8_matmul_quantized(m.w, a, ref.data(), Isa::kAvx512Vnni, Int8Form::kSmallT);
  EXPECT_EQ(y, ref);
  EXPECT_DEATH(int8_matmul_quantized(m.w, a, ref.data(), Isa::kAvx512Vnni, Int8Form::kGemm), "in % 128 == 0");
}

}  // namespace
}  // namespace kestrel::kernels
