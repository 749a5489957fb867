// Packed Q4_0 (kernels/cpu/gguf_q4_x16.h):
// - the packed bytes are where the layout says (scales, the 4 code units of every row and block, zero rows
//   past `out`);
// - the scalar lane model equals the fp64 dot of the dequantized weights and activations within fp32
//   summation error (1e-6 · Σ|w·x|);
// - the AVX-512 and AVX2 kernels equal the lane model bit for bit for every token at every T (1..20, 33, 70),
//   any row range (cut inside 16-row groups), tokens picked by index, out not a multiple of 16;
// - matmul() runs them on a packed matrix (bitwise), and the exact path on an unpacked one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/w4a8_isa.h"

namespace kestrel::kernels {
namespace {

// Random Q4_0 blocks with fp16 scales in ±[2^-10, 2^4).
std::vector<uint8_t> random_q4_0(int64_t out, int64_t in, std::mt19937& rng) {
  std::vector<uint8_t> data(static_cast<size_t>(out * in / 32 * 18));
  for (auto& v : data) v = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < data.size(); b += 18) {
    const uint16_t h = static_cast<uint16_t>((rng() & 0x8000u) | ((5 + rng() % 14) << 10) | (rng() & 0x3ffu));
    std::memcpy(&data[b], &h, 2);
  }
  // Rows 0..3 all codes 0 (−8), rows 4..7 all 15 (+7): the largest block sums, whose products with d_w are
  // not exact in fp32, so the order of the scale products shows in the bits.
  for (int64_t r = 0; r < std::min<int64_t>(out, 8); ++r)
    for (int64_t b = 0; b < in / 32; ++b) std::memset(&data[static_cast<size_t>((r * (in / 32) + b) * 18 + 2)], r < 4 ? 0x00 : 0xff, 16);
  return data;
}

std::vector<float> random_x(int64_t T, int64_t in, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = dist(rng);
  if (T > 1)
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(in + j)] = 0;  // token 1, block 0: all zero (d = 0)
  if (T > 2)  // token 2 all positive: with the constant-code rows below, block sums of 15 bits and more
    for (int64_t k = 0; k < in; ++k) x[static_cast<size_t>(2 * in + k)] = 1.0f + std::fabs(x[static_cast<size_t>(2 * in + k)]) / 2;
  return x;
}

struct Packed {
  std::vector<uint8_t> raw;
  AlignedVector<uint8_t> packed;
  WeightMatrix w;
  Packed(int64_t out, int64_t in, std::mt19937& rng) : raw(random_q4_0(out, in, rng)) {
    w.format = WeightFormat::kGgufQ4_0, w.out = out, w.in = in, w.data = raw.data();
    packed = pack_q4_0_x16(w);
    w.packed = packed.data();
  }
};

void prepare(Q8Acts& a, const std::vector<float>& x, int64_t T, int64_t in) {
  q8_acts_prepare(a, T, in, /*gemm_q4=*/true);
  q8_acts_fill(x.data(), 0, T, a);
}

TEST(GgufQ4x16, PackedBytesFollowTheLayout) {
  std::mt19937 rng(1);
  const int64_t out = 21, in = 96, nb = in / 32;  // two groups, the second with 5 rows
  Packed p(out, in, rng);
  ASSERT_EQ(p.packed.size(), static_cast<size_t>(2 * nb * 288));
  for (int64_t r = 0; r < 32; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p.packed.data() + ((r / 16) * nb + b) * 288;
      const int64_t i = r % 16;
      const uint8_t* src = r < out ? p.raw.data() + (r * nb + b) * 18 : nullptr;
      for (int k = 0; k < 2; ++k) ASSERT_EQ(blk[2 * i + k], src ? src[k] : 0) << "scale r " << r << " b " << b;
      for (int j = 0; j < 16; ++j)
        ASSERT_EQ(blk[32 + 64 * (j / 4) + 4 * i + j % 4], src ? src[2 + j] : 0) << "code r " << r << " b " << b << " j " << j;
    }
}

TEST(GgufQ4x16, LaneModelMatchesFp64) {
  std::mt19937 rng(2);
  const int64_t out = 19, in = 288, T = 5;
  Packed p(out, in, rng);
  const std::vector<float> x = random_x(T, in, rng);
  Q8Acts a;
  prepare(a, x, T, in);
  const int64_t P = a.nc * 128;
  std::vector<float> y(static_cast<size_t>(T * out)), row(static_cast<size_t>(in));
  q4_x16_rows_model(p.w, a, nullptr, T, y.data(), out, 0, out);
  for (int64_t r = 0; r < out; ++r) {
    decode_row(p.w, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double xv = static_cast<double>(a.q[static_cast<size_t>(t * P + k)]) * a.d[static_cast<size_t>(t * (P / 32) + k / 32)];
        s += row[static_cast<size_t>(k)] * xv, m += std::fabs(row[static_cast<size_t>(k)] * xv);
      }
      ASSERT_NEAR(y[static_cast<size_t>(t * out + r)], s, 1e-6 * m + 1e-30) << "r " << r << " t " << t;
    }
  }
}

using RowsFn = void (*)(const WeightMatrix&, const Q8Acts&, const int32_t*, int64_t, float*, int64_t, int64_t, int64_t);

struct Shape {
  int64_t out, in;
};

class GgufQ4x16Kernel : public ::testing::TestWithParam<Shape> {
 protected:
  // Every T in 1..20, 33, 70: the kernel over all tokens, rows cut at odd places, equals the lane model.
  void equals_model_at_every_t(RowsFn fn) {
    const auto [out, in] = GetParam();
    std::mt19937 rng(static_cast<unsigned>(out * 131 + in));
    Packed p(out, in, rng);
    for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 33, 70}) {
      const std::vector<float> x = random_x(T, in, rng);
      Q8Acts a;
      prepare(a, x, T, in);
      std::vector<float> want(static_cast<size_t>(T * out)), got(static_cast<size_t>(T * out), -1.0f);
      q4_x16_rows_model(p.w, a, nullptr, T, want.data(), out, 0, out);
      const int64_t cut1 = std::min<int64_t>(out, 5), cut2 = std::min<int64_t>(out, 21);
      fn(p.w, a, nullptr, T, got.data(), out, 0, cut1);
      fn(p.w, a, nullptr, T, got.data(), out, cut1, cut2);
      fn(p.w, a, nullptr, T, got.data(), out, cut2, out);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "T " << T << " token " << i / out << " row " << i % out;
    }
  }
  // Tokens picked by index (repeats, reversed): each picked token's row of the plain product, bit for bit.
  void picked_tokens_keep_their_bits(RowsFn fn) {
    const auto [out, in] = GetParam();
    std::mt19937 rng(static_cast<unsigned>(out * 7 + in));
    Packed p(out, in, rng);
    const int64_t T = 13;
    const std::vector<float> x = random_x(T, in, rng);
    Q8Acts a;
    prepare(a, x, T, in);
    std::vector<float> all(static_cast<size_t>(T * out));
    fn(p.w, a, nullptr, T, all.data(), out, 0, out);
    const std::vector<int32_t> tok = {12, 3, 3, 0, 7, 11, 1, 2, 9, 5, 4};
    const int64_t n = static_cast<int64_t>(tok.size());
    std::vector<float> got(static_cast<size_t>(n * out));
    fn(p.w, a, tok.data(), n, got.data(), out, 0, out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(got[static_cast<size_t>(i * out + r)], all[static_cast<size_t>(tok[static_cast<size_t>(i)] * out + r)])
            << "pick " << i << " row " << r;
    for (int32_t one : {12, 0, 5}) {  // one picked token (a decode step's routed expert): the one-token form
      std::vector<float> y1(static_cast<size_t>(out), -1.0f);
      fn(p.w, a, &one, 1, y1.data(), out, 0, out);
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(y1[static_cast<size_t>(r)], all[static_cast<size_t>(one * out + r)]) << "alone: token " << one << " row " << r;
    }
  }
};

TEST_P(GgufQ4x16Kernel, Avx512EqualsTheLaneModelAtEveryT) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  equals_model_at_every_t(q4_x16_rows_avx512);
}

TEST_P(GgufQ4x16Kernel, Avx512PickedTokensKeepTheirBits) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  picked_tokens_keep_their_bits(q4_x16_rows_avx512);
}

TEST_P(GgufQ4x16Kernel, Avx2EqualsTheLaneModelAtEveryT) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2: " << isa_unsupported_reason(Isa::kAvx2);
  equals_model_at_every_t(q4_x16_rows_avx2);
}

TEST_P(GgufQ4x16Kernel, Avx2PickedTokensKeepTheirBits) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2: " << isa_unsupported_reason(Isa::kAvx2);
  picked_tokens_keep_their_bits(q4_x16_rows_avx2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GgufQ4x16Kernel,
                         ::testing::Values(Shape{16, 32}, Shape{37, 288}, Shape{64, 512}, Shape{7, 128}, Shape{48, 2304}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.out) + "x" + std::to_string(info.param.in);
                         });

// matmul() on a packed Q4_0 matrix runs the packed kernel of the active ISA (the lane model's bits) at any T;
// the same matrix without its packed rows, or with the int8 mode off, takes the exact fp32 path.
TEST(GgufQ4x16, MatmulRunsThePackedKernelAndTheExactPathWithoutIt) {
  if (!gguf_int8_enabled() || !(isa_supported(Isa::kAvx512Vnni) || isa_supported(Isa::kAvx2)))
    GTEST_SKIP() << "no int8 kernel on this CPU";
  std::mt19937 rng(3);
  const int64_t out = 40, in = 256;
  Packed p(out, in, rng);
  for (int64_t T : {1, 3, 16, 40}) {
    const std::vector<float> x = random_x(T, in, rng);
    Q8Acts a;
    prepare(a, x, T, in);
    std::vector<float> want(static_cast<size_t>(T * out)), got(static_cast<size_t>(T * out));
    q4_x16_rows_model(p.w, a, nullptr, T, want.data(), out, 0, out);
    ASSERT_TRUE(gguf_int8_applies(p.w));
    matmul(p.w, x.data(), T, got.data());
    EXPECT_EQ(got, want) << "T " << T;
    WeightMatrix plain = p.w;
    plain.packed = nullptr;
    EXPECT_FALSE(gguf_int8_applies(plain));
    std::vector<float> exact(static_cast<size_t>(T * out)), ref(static_cast<size_t>(T * out));
    matmul(plain, x.data(), T, exact.data());
    matmul_reference(plain, x.data(), T, ref.data());
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t r = 0; r < out; ++r) {
      decode_row(plain, r, row.data());
      for (int64_t t = 0; t < T; ++t) {
        double m = 0;
        for (int64_t k = 0; k < in; ++k) m += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(t * in + k)]);
        ASSERT_NEAR(exact[static_cast<size_t>(t * out + r)], ref[static_cast<size_t>(t * out + r)], 1e-5 * m + 1e-30)
            << "exact path T " << T << " t " << t << " r " << r;
      }
    }
  }
}

// A view of rows [16, 48) (MLA's per-head k_b / v_b matrices are such views) reads its own packed rows.
TEST(GgufQ4x16, RowViewReadsItsOwnPackedRows) {
  std::mt19937 rng(5);
  const int64_t out = 53, in = 128, T = 3;
  Packed p(out, in, rng);
  const std::vector<float> x = random_x(T, in, rng);
  Q8Acts a;
  prepare(a, x, T, in);
  std::vector<float> all(static_cast<size_t>(T * out)), part(static_cast<size_t>(T * 32));
  q4_x16_rows_model(p.w, a, nullptr, T, all.data(), out, 0, out);
  const WeightMatrix v = q4_0_row_view(p.w, 16, 32);
  if (!gguf_int8_applies(v)) GTEST_SKIP() << "no int8 kernel on this CPU";
  gguf_int8_product(v, a, part.data(), 32, 0, 32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < 32; ++r)
      ASSERT_EQ(part[static_cast<size_t>(t * 32 + r)], all[static_cast<size_t>(t * out + 16 + r)]) << "t " << t << " r " << r;
  EXPECT_DEATH(q4_0_row_view(p.w, 8, 16), "multiple of 16");
}

TEST(GgufQ4x16, RefusesActivationsWithoutTheirLayout) {
  std::mt19937 rng(4);
  Packed p(16, 64, rng);
  const std::vector<float> x = random_x(2, 64, rng);
  Q8Acts a;
  quantize_q8_0_acts(x.data(), 2, 64, a);  // no Q4_0 layout
  std::vector<float> y(32);
  if (isa_supported(Isa::kAvx512Vnni)) {
    EXPECT_DEATH(q4_x16_rows_avx512(p.w, a, nullptr, 2, y.data(), 16, 0, 16), "Q4_0 layout");
  }
  if (isa_supported(Isa::kAvx2)) {
    EXPECT_DEATH(q4_x16_rows_avx2(p.w, a, nullptr, 2, y.data(), 16, 0, 16), "Q4_0 layout");
  }
}

}  // namespace
}  // namespace kestrel::kernels
