// FP8 128×128 block weights (DeepSeek, docs/model-math.md §8): decode against values fixed by the
// OCP E4M3 spec (not by our converter), the block → scale mapping on partial edge blocks, and the
// matmul paths agreeing with the fp64 scalar reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_fp8.h"

namespace kestrel::kernels {
namespace {

struct Fp8Mat {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
  std::vector<uint8_t> scale_bytes;
  WeightMatrix w;
};

Fp8Mat make(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Mat m;
  m.codes.resize(static_cast<size_t>(out * in));
  for (auto& c : m.codes) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
  }
  m.scale_inv.resize(static_cast<size_t>(fp8_blocks(out) * fp8_blocks(in)));
  for (size_t i = 0; i < m.scale_inv.size(); ++i) m.scale_inv[i] = std::ldexp(1.0f + 0.125f * static_cast<float>(i), -8);
  // Stored one byte off alignment, as a raw mmap could hand it over.
  m.scale_bytes.resize(m.scale_inv.size() * 4 + 1);
  std::memcpy(m.scale_bytes.data() + 1, m.scale_inv.data(), m.scale_inv.size() * 4);
  m.w.format = WeightFormat::kFp8Block, m.w.out = out, m.w.in = in;
  m.w.data = m.codes.data();
  m.w.scales = m.scale_bytes.data() + 1;
  return m;
}

TEST(Fp8Block, DecodesSpecValuesWithTheirBlockScale) {
  // OCP 8-bit FP E4M3 (fn): bias 7, 3 mantissa bits, no infinities.
  struct Code {
    uint8_t c;
    float v;
  };
  const Code codes[] = {{0x00, 0.0f},   {0x38, 1.0f},     {0x40, 2.0f},          {0x3c, 1.5f},
                        {0x7e, 448.0f}, {0xfe, -448.0f},  {0x01, 0.001953125f},  {0x08, 0.015625f},
                        {0xb8, -1.0f},  {0x07, 0.013671875f}};
  Fp8Mat m = make(130, 200, 1);  // 2×2 scale blocks, both edges partial
  for (int64_t r : {0L, 127L, 128L, 129L})
    for (int64_t j : {0L, 5L, 127L, 128L, 199L}) {
      const Code& k = codes[static_cast<size_t>((r + j) % 10)];
      m.codes[static_cast<size_t>(r * 200 + j)] = k.c;
    }
  std::vector<float> row(200);
  for (int64_t r : {0L, 127L, 128L, 129L}) {
    decode_row(m.w, r, row.data());
    for (int64_t j : {0L, 5L, 127L, 128L, 199L}) {
      const float s = m.scale_inv[static_cast<size_t>((r / 128) * 2 + j / 128)];
      EXPECT_EQ(row[static_cast<size_t>(j)], codes[static_cast<size_t>((r + j) % 10)].v * s) << r << "," << j;
    }
  }
}

// The vectorised decoder against the scalar converter for every code (incl. both NaNs), in the
// 16-wide body and in the scalar row tail.
TEST(Fp8Block, AllCodesVectorAndTailAgreeWithScalar) {
  Fp8Mat m = make(1, 256 + 7, 2);
  for (int i = 0; i < 256 + 7; ++i) m.codes[static_cast<size_t>(i)] = static_cast<uint8_t>(i < 256 ? i : 0x78 + i);
  std::vector<float> row(256 + 7);
  decode_row(m.w, 0, row.data());
  for (int i = 0; i < 256 + 7; ++i) {
    const float s = m.scale_inv[static_cast<size_t>(i / 128)];
    const float want = f8e4m3_to_f32(m.codes[static_cast<size_t>(i)]) * s;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(row[static_cast<size_t>(i)])) << i;
    } else {
      EXPECT_EQ(row[static_cast<size_t>(i)], want) << "code " << i;
      EXPECT_EQ(std::signbit(row[static_cast<size_t>(i)]), std::signbit(want)) << i;  // -0 stays -0
    }
  }
}

TEST(Fp8Block, MatmulMatchesScalarReference) {
  for (int64_t T : {1, 3, 17}) {
    Fp8Mat m = make(300, 257, 7);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> x(static_cast<size_t>(T * 257)), y(static_cast<size_t>(T * 300)), ref(y.size());
    for (auto& v : x) v = d(rng);
    matmul(m.w, x.data(), T, y.data());
    matmul_reference(m.w, x.data(), T, ref.data());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(y[i] - ref[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
    }
    // fp32 accumulation over 257 terms vs fp64: a few ulps of the largest partial sums.
    EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "T=" << T;
  }
}

}  // namespace
}  // namespace kestrel::kernels
