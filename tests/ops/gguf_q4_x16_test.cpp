// Packed Q4_0 and MXFP4 (kernels/cpu/gguf_q4_x16.h), each test for both formats:
// - the packed bytes are where the layout says (scales, the 4 code units of every row and block, zero rows
//   past `out`, MXFP4's zero second scale half);
// - the scalar lane model equals the fp64 dot of the dequantized weights and activations within fp32
//   summation error (1e-6 · Σ|w·x|); for MXFP4 it has the integer block sums of gguf_int8_rows_scalar (the
//   in-place reference): equal bit for bit with one block per row, within fp32 reassociation of the same
//   products otherwise;
// - the AVX-512 and AVX2 kernels equal the lane model bit for bit for every token at every T (1..20, 33, 64,
//   65, 70), any row range (cut inside 16-row groups), tokens picked by index, out not a multiple of 16;
//   MXFP4 rows of constant codes ±12 against all-positive tokens give block sums past int16 (AVX2 widening);
//   E8M0 scales 0, 1 (fp32 subnormals), 2, 127, 128, 254, 255 decode as gguf_e8m0_half;
// - matmul() runs them on a packed matrix (bitwise, the lane model's bits at every T), and without packed rows
//   Q4_0 the exact path, MXFP4 its in-place int8 kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
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

// Random MXFP4 blocks with E8M0 scales 2^(e−128), e in [118, 136). Rows 0..3 all code 7 (+12 as 2·E2M1),
// rows 4..7 all code 15 (−12): block sums up to 12 · 127 · 32 = 48768, past int16 (the AVX2 kernel must
// widen before that) and not exact in fp32 products with the scales.
std::vector<uint8_t> random_mxfp4(int64_t out, int64_t in, std::mt19937& rng) {
  std::vector<uint8_t> data(static_cast<size_t>(out * in / 32 * 17));
  for (auto& v : data) v = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < data.size(); b += 17) data[b] = static_cast<uint8_t>(118 + rng() % 18);
  for (int64_t r = 0; r < std::min<int64_t>(out, 8); ++r)
    for (int64_t b = 0; b < in / 32; ++b)
      std::memset(&data[static_cast<size_t>((r * (in / 32) + b) * 17 + 1)], r < 4 ? 0x77 : 0xff, 16);
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

constexpr WeightFormat kQ4_0 = WeightFormat::kGgufQ4_0, kMxfp4 = WeightFormat::kGgufMxfp4;

const char* name(WeightFormat f) { return f == kQ4_0 ? "q4_0" : "mxfp4"; }

struct Packed {
  std::vector<uint8_t> raw;
  AlignedVector<uint8_t> packed;
  WeightMatrix w;
  Packed(WeightFormat f, int64_t out, int64_t in, std::mt19937& rng)
      : raw(f == kQ4_0 ? random_q4_0(out, in, rng) : random_mxfp4(out, in, rng)) {
    w.format = f, w.out = out, w.in = in, w.data = raw.data();
    repack();
  }
  // After raw changes.
  void repack() {
    packed = w.format == kQ4_0 ? pack_q4_0_x16(w) : pack_mxfp4_x16(w);
    w.packed = packed.data();
  }
};

void prepare(Q8Acts& a, const std::vector<float>& x, int64_t T, int64_t in) {
  q8_acts_prepare(a, T, in, /*gemm_q4=*/true);
  q8_acts_fill(x.data(), 0, T, a);
}

class GgufX16 : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(GgufX16, PackedBytesFollowTheLayout) {
  std::mt19937 rng(1);
  const int64_t out = 21, in = 96, nb = in / 32;  // two groups, the second with 5 rows
  Packed p(GetParam(), out, in, rng);
  const int64_t sb = GetParam() == kQ4_0 ? 2 : 1, bb = sb + 16;  // scale bytes, block bytes
  ASSERT_EQ(p.packed.size(), static_cast<size_t>(2 * nb * 288));
  for (int64_t r = 0; r < 32; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p.packed.data() + ((r / 16) * nb + b) * 288;
      const int64_t i = r % 16;
      const uint8_t* src = r < out ? p.raw.data() + (r * nb + b) * bb : nullptr;
      for (int k = 0; k < sb; ++k) ASSERT_EQ(blk[sb * i + k], src ? src[k] : 0) << "scale r " << r << " b " << b;
      if (sb == 1) {
        ASSERT_EQ(blk[16 + i], 0) << "MXFP4 scale region [16, 32) r " << r << " b " << b;
      }
      for (int j = 0; j < 16; ++j)
        ASSERT_EQ(blk[32 + 64 * (j / 4) + 4 * i + j % 4], src ? src[sb + j] : 0) << "code r " << r << " b " << b << " j " << j;
    }
}

TEST_P(GgufX16, LaneModelMatchesFp64) {
  std::mt19937 rng(2);
  const int64_t out = 19, in = 288, T = 5;
  Packed p(GetParam(), out, in, rng);
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

// MXFP4: the lane model's block sums are gguf_int8_rows_scalar's (the in-place reference, which sums the
// blocks' float(isum) · (d_w · d_x) unfused): with one block per row the two are the same rounding of the
// same product, bit for bit; with more they differ by fp32 reassociation only, at most (nb + 1) rounding
// errors of 2^-24 · Σ_b |isum_b · d_w · d_x|.
TEST(GgufX16, MxfpModelHasTheInPlaceReferenceBlockSums) {
  std::mt19937 rng(6);
  for (const int64_t in : {32, 64, 2304}) {
    const int64_t out = 24, T = 6, nb = in / 32;
    Packed p(kMxfp4, out, in, rng);
    const std::vector<float> x = random_x(T, in, rng);
    Q8Acts a;
    prepare(a, x, T, in);
    std::vector<float> model(static_cast<size_t>(T * out)), ref(static_cast<size_t>(T * out));
    q4_x16_rows_model(p.w, a, nullptr, T, model.data(), out, 0, out);
    gguf_int8_rows_scalar(p.w, a, ref.data(), out, 0, out);
    const int64_t P = a.nc * 128;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r) {
        const size_t k = static_cast<size_t>(t * out + r);
        if (nb == 1) {
          ASSERT_EQ(model[k], ref[k]) << "in " << in << " t " << t << " r " << r;
          continue;
        }
        double m = 0;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = p.raw.data() + (r * nb + b) * 17;
          const int8_t* q = a.q.data() + t * P + b * 32;
          int64_t isum = 0;
          for (int j = 0; j < 16; ++j)
            isum += kGgufE2M1Doubled[blk[1 + j] & 15] * q[j] + kGgufE2M1Doubled[blk[1 + j] >> 4] * q[j + 16];
          m += std::fabs(static_cast<double>(isum) * gguf_e8m0_half(blk[0]) * a.d[static_cast<size_t>(t * (P / 32) + b)]);
        }
        ASSERT_NEAR(model[k], ref[k], static_cast<double>(nb + 1) * std::ldexp(m, -24) + 1e-37)
            << "in " << in << " t " << t << " r " << r;
      }
  }
}

using RowsFn = void (*)(const WeightMatrix&, const Q8Acts&, const int32_t*, int64_t, float*, int64_t, int64_t, int64_t);

struct Shape {
  WeightFormat f;
  int64_t out, in;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << name(s.f) << " " << s.out << "x" << s.in; }

class GgufQ4x16Kernel : public ::testing::TestWithParam<Shape> {
 protected:
  // Every T in 1..20, 33, 64, 65, 70: the kernel over all tokens, rows cut at odd places, equals the lane model.
  // `more`: further T values for the kernel.
  void equals_model_at_every_t(RowsFn fn, std::vector<int64_t> more = {}) {
    const auto [f, out, in] = GetParam();
    std::mt19937 rng(static_cast<unsigned>(out * 131 + in));
    Packed p(f, out, in, rng);
    std::vector<int64_t> Ts = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 33, 64, 65, 70};
    Ts.insert(Ts.end(), more.begin(), more.end());
    for (int64_t T : Ts) {
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
    const auto [f, out, in] = GetParam();
    std::mt19937 rng(static_cast<unsigned>(out * 7 + in));
    Packed p(f, out, in, rng);
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
    for (int32_t one : {12, 0, 5, 2}) {  // one picked token (a decode step's routed expert): the one-token form
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

// The AMX tile form, on the tile unit where the CPU has one and through the emulated unit everywhere (its
// float step is AVX-512): every T above, plus passes of 128 tokens and their tails.
TEST_P(GgufQ4x16Kernel, AmxEqualsTheLaneModelAtEveryT) {
  if (!isa_supported(Isa::kAmx)) GTEST_SKIP() << "AMX: " << isa_unsupported_reason(Isa::kAmx);
  equals_model_at_every_t(q4_x16_rows_amx, {128, 129, 160, 300});
}

TEST_P(GgufQ4x16Kernel, AmxPickedTokensKeepTheirBits) {
  if (!isa_supported(Isa::kAmx)) GTEST_SKIP() << "AMX: " << isa_unsupported_reason(Isa::kAmx);
  picked_tokens_keep_their_bits(q4_x16_rows_amx);
}

TEST_P(GgufQ4x16Kernel, AmxEmulatedEqualsTheLaneModelAtEveryT) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  equals_model_at_every_t(q4_x16_rows_amx_emulated, {129});
}

TEST_P(GgufQ4x16Kernel, AmxEmulatedPickedTokensKeepTheirBits) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  picked_tokens_keep_their_bits(q4_x16_rows_amx_emulated);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GgufQ4x16Kernel,
                         ::testing::Values(Shape{kQ4_0, 16, 32}, Shape{kQ4_0, 37, 288}, Shape{kQ4_0, 64, 512},
                                           Shape{kQ4_0, 7, 128}, Shape{kQ4_0, 48, 2304}, Shape{kMxfp4, 16, 32},
                                           Shape{kMxfp4, 37, 288}, Shape{kMxfp4, 64, 512}, Shape{kMxfp4, 7, 128},
                                           Shape{kMxfp4, 48, 2304}, Shape{kMxfp4, 45, 2880}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(name(info.param.f)) + "_" + std::to_string(info.param.out) + "x" +
                                  std::to_string(info.param.in);
                         });

// E8M0 scales at the ends of the range (0 and 1: the fp32 subnormals 2^-128, 2^-127; 255: 2^127) and
// around them: both kernels give the lane model's bits, whose d_w is gguf_e8m0_half(e). The small scales
// meet plain activations, the large ones activations scaled by 2^-40, so that no product overflows.
TEST(GgufX16, MxfpScalesDecodeLikeTheReference) {
  std::mt19937 rng(7);
  struct Case {
    std::vector<uint8_t> es;
    float x_scale;
  };
  for (const Case& c : {Case{{0, 1, 2, 3, 127, 128}, 1.0f}, Case{{127, 128, 254, 255}, 0x1p-40f}}) {
    const int64_t out = 21, in = 96, nb = in / 32, T = 3, ne = static_cast<int64_t>(c.es.size());
    Packed p(kMxfp4, out, in, rng);
    for (int64_t r = 0; r < out; ++r)
      for (int64_t b = 0; b < nb; ++b) p.raw[static_cast<size_t>((r * nb + b) * 17)] = c.es[static_cast<size_t>((r + b) % ne)];
    p.repack();
    std::vector<float> x = random_x(T, in, rng);
    for (float& v : x) v *= c.x_scale;
    Q8Acts a;
    prepare(a, x, T, in);
    std::vector<float> want(static_cast<size_t>(T * out));
    q4_x16_rows_model(p.w, a, nullptr, T, want.data(), out, 0, out);
    for (const float v : want) ASSERT_TRUE(std::isfinite(v));
    for (RowsFn fn : {q4_x16_rows_avx512, q4_x16_rows_avx2, q4_x16_rows_amx, q4_x16_rows_amx_emulated}) {
      if ((fn == q4_x16_rows_avx512 || fn == q4_x16_rows_amx_emulated) && !isa_supported(Isa::kAvx512Vnni)) continue;
      if (fn == q4_x16_rows_avx2 && !isa_supported(Isa::kAvx2)) continue;
      if (fn == q4_x16_rows_amx && !isa_supported(Isa::kAmx)) continue;
      for (const int64_t n : {T, int64_t{1}}) {  // the AVX2 kernel's one-token form too
        std::vector<float> got(static_cast<size_t>(n * out), -1.0f);
        fn(p.w, a, nullptr, n, got.data(), out, 0, out);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << (fn == q4_x16_rows_avx2 ? "avx2" : fn == q4_x16_rows_avx512 ? "avx512" : "amx") << " x scale " << c.x_scale << " n "
                                     << n << " t " << i / out << " r " << i % out;
      }
    }
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(gguf_e8m0_half(0)), 0x00200000u);
  EXPECT_EQ(gguf_e8m0_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(gguf_e8m0_half(2), std::ldexp(1.0f, -126));
  EXPECT_EQ(gguf_e8m0_half(127), 0.5f);
  EXPECT_EQ(gguf_e8m0_half(254), std::ldexp(1.0f, 126));
}

// matmul() on a packed matrix runs the packed kernel of the active ISA (the lane model's bits) at any T, and
// so do gguf_int8_product / _at (tokens picked by index), with the Q4_0 activation layout whatever the
// format. Without its packed rows a Q4_0 matrix takes the exact fp32 path, an MXFP4 matrix its in-place int8
// kernels (gguf_int8.h).
TEST_P(GgufX16, MatmulRunsThePackedKernel) {
  if (!gguf_int8_enabled() || !(isa_supported(Isa::kAvx512Vnni) || isa_supported(Isa::kAvx2)))
    GTEST_SKIP() << "no int8 kernel on this CPU";
  std::mt19937 rng(3);
  const int64_t out = 40, in = 256;
  Packed p(GetParam(), out, in, rng);
  for (int64_t T : {1, 3, 16, 40, 64, 65}) {
    const std::vector<float> x = random_x(T, in, rng);
    Q8Acts a;
    prepare(a, x, T, in);
    std::vector<float> want(static_cast<size_t>(T * out)), got(static_cast<size_t>(T * out));
    q4_x16_rows_model(p.w, a, nullptr, T, want.data(), out, 0, out);
    ASSERT_TRUE(gguf_int8_applies(p.w));
    ASSERT_TRUE(gguf_int8_runs_packed(p.w));
    const Q8Layouts l = gguf_int8_layout(p.w, T);
    EXPECT_TRUE(l.q4 && !l.q8 && !l.mx) << "T " << T;
    matmul(p.w, x.data(), T, got.data());
    EXPECT_EQ(got, want) << "T " << T;
    std::fill(got.begin(), got.end(), -1.0f);
    gguf_int8_product(p.w, a, got.data(), out, 0, out);
    EXPECT_EQ(got, want) << "gguf_int8_product T " << T;
    const std::vector<int32_t> tok = {static_cast<int32_t>(T - 1), 0};
    std::vector<float> picked(static_cast<size_t>(2 * out));
    gguf_int8_product_at(p.w, a, tok.data(), 2, picked.data(), out, 0, out);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(picked[static_cast<size_t>(i * out + r)], want[static_cast<size_t>(tok[static_cast<size_t>(i)] * out + r)])
            << "gguf_int8_product_at T " << T << " pick " << i << " r " << r;
  }
}

// An MXFP4 matrix without packed rows keeps the in-place int8 kernels: matmul gives their bits (the small-T
// kernel's, which the GEMM form shares), not the lane model's.
TEST(GgufX16, UnpackedMxfpRunsTheInPlaceKernels) {
  if (!gguf_int8_enabled() || !(isa_supported(Isa::kAvx512Vnni) || isa_supported(Isa::kAvx2)))
    GTEST_SKIP() << "no int8 kernel on this CPU";
  std::mt19937 rng(8);
  const int64_t out = 40, in = 256;
  Packed p(kMxfp4, out, in, rng);
  WeightMatrix plain = p.w;
  plain.packed = nullptr;
  ASSERT_TRUE(gguf_int8_applies(plain));
  EXPECT_FALSE(gguf_int8_runs_packed(plain));
  for (int64_t T : {1, 3, 16, 70}) {
    const std::vector<float> x = random_x(T, in, rng);
    Q8Acts a;
    quantize_q8_0_acts(x.data(), T, in, a);
    EXPECT_FALSE(gguf_int8_layout(plain, T).q4) << "T " << T;
    std::vector<float> want(static_cast<size_t>(T * out)), got(static_cast<size_t>(T * out));
    if (active_isa() == Isa::kAvx512Vnni || active_isa() == Isa::kAmx) gguf_int8_rows_avx512(plain, a, want.data(), out, 0, out);
    else gguf_int8_rows_avx2(plain, a, want.data(), out, 0, out);
    matmul(plain, x.data(), T, got.data());
    EXPECT_EQ(got, want) << "T " << T;
  }
}

// Q4_0 without its packed rows, or with the int8 mode off, takes the exact fp32 path.
TEST(GgufQ4x16, MatmulTakesTheExactPathWithoutPackedRows) {
  if (!gguf_int8_enabled() || !(isa_supported(Isa::kAvx512Vnni) || isa_supported(Isa::kAvx2)))
    GTEST_SKIP() << "no int8 kernel on this CPU";
  std::mt19937 rng(3);
  const int64_t out = 40, in = 256;
  Packed p(kQ4_0, out, in, rng);
  for (int64_t T : {1, 3, 16, 40}) {
    const std::vector<float> x = random_x(T, in, rng);
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

// A view of rows [16, 48) (MLA's per-head k_b / v_b matrices are such views) reads its own packed rows and
// its own ggml rows.
TEST_P(GgufX16, RowViewReadsItsOwnRows) {
  std::mt19937 rng(5);
  const int64_t out = 53, in = 128, T = 3;
  Packed p(GetParam(), out, in, rng);
  const std::vector<float> x = random_x(T, in, rng);
  Q8Acts a;
  prepare(a, x, T, in);
  std::vector<float> all(static_cast<size_t>(T * out)), part(static_cast<size_t>(T * 32));
  q4_x16_rows_model(p.w, a, nullptr, T, all.data(), out, 0, out);
  const WeightMatrix v = x16_row_view(p.w, 16, 32);
  q4_x16_rows_model(v, a, nullptr, T, part.data(), 32, 0, 32);  // from the view's ggml rows
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < 32; ++r)
      ASSERT_EQ(part[static_cast<size_t>(t * 32 + r)], all[static_cast<size_t>(t * out + 16 + r)]) << "model t " << t << " r " << r;
  EXPECT_DEATH(x16_row_view(p.w, 8, 16), "multiple of 16");
  if (!gguf_int8_applies(v)) GTEST_SKIP() << "no int8 kernel on this CPU";
  std::fill(part.begin(), part.end(), -1.0f);
  gguf_int8_product(v, a, part.data(), 32, 0, 32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < 32; ++r)
      ASSERT_EQ(part[static_cast<size_t>(t * 32 + r)], all[static_cast<size_t>(t * out + 16 + r)]) << "t " << t << " r " << r;
}

// The packed kernels read −8·Σq per block (Q8Acts::gemm_q4) for either format, MXFP4 included.
TEST_P(GgufX16, RefusesActivationsWithoutTheQ4_0Layout) {
  std::mt19937 rng(4);
  Packed p(GetParam(), 16, 64, rng);
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
  q8_acts_prepare(a, 2, 64, /*gemm_q4=*/false, /*gemm_q8=*/false, /*gemm_mx=*/true);  // MXFP4's GEMM layout: not it
  q8_acts_fill(x.data(), 0, 2, a);
  if (isa_supported(Isa::kAvx512Vnni)) {
    EXPECT_DEATH(q4_x16_rows_avx512(p.w, a, nullptr, 2, y.data(), 16, 0, 16), "Q4_0 layout");
  }
  if (isa_supported(Isa::kAvx2)) {
    EXPECT_DEATH(q4_x16_rows_avx2(p.w, a, nullptr, 2, y.data(), 16, 0, 16), "Q4_0 layout");
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GgufX16, ::testing::Values(kQ4_0, kMxfp4),
                         [](const ::testing::TestParamInfo<WeightFormat>& info) { return std::string(name(info.param)); });

}  // namespace
}  // namespace kestrel::kernels
