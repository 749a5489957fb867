// GGUF block weights × Q8_0 activations (kernels/cpu/gguf_int8.h), the Q8_0 and MXFP4 kernels (Q4_0's
// packed kernels are tests/ops/gguf_q4_x16_test.cpp):
// - activation quantization reproduces llama.cpp's x86 quantize_row_q8_0 bit for bit (golden from a numpy
//   transcription in tools/gen_gguf_goldens.py; gguf-py's reference quantizer gives the same codes there);
// - the scalar kernel equals the fp64 dot of the dequantized weights (gguf-py-checked decoders) and the
//   dequantized activations within fp32 summation error (1e-6 · Σ|w·x|: ≤ 16 block terms);
// - the AVX-512 VNNI kernel equals the scalar kernel within 1e-5 · Σ|w·x| (same exact int32 block sums,
//   other fp32 order), gives every token and row the same bits at any batch size and row split, and is
//   what matmul() runs in the default int8 mode (the exact path when the mode is off);
// - the prefill GEMM forms (Q8_0 / MXFP4; AVX-512 and AVX2) give the small-T kernel's bits for every
//   token at every T;
// - picked tokens (gguf_int8_rows_at) keep their bits, and stripe-wise quantization equals whole rows;
// - one input shared by Q4_0 (packed), Q8_0 and MXFP4 products gives each its own kernel's bits, and the
//   Q8_0 / MXFP4 kernels refuse a Q4_0 matrix.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/w4a8_isa.h"
#include "loader/safetensors.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

std::vector<uint8_t> golden_u8(const std::string& name, std::vector<float>* f32 = nullptr) {
  auto f = SafetensorsFile::open(std::string(KESTREL_TEST_DATA) + "/ops/gguf_blocks.safetensors");
  if (!f) throw std::runtime_error(f.error().message());
  for (const auto& e : f->header().entries) {
    if (e.name != name) continue;
    const TensorView v = f->view(e);
    if (f32 != nullptr) *f32 = to_f32(v);
    else return std::vector<uint8_t>(v.as<uint8_t>(), v.as<uint8_t>() + v.numel());
    return {};
  }
  throw std::runtime_error("missing golden tensor " + name);
}

TEST(GgufInt8, ActivationQuantizationMatchesLlamaCpp) {
  std::vector<float> x;
  golden_u8("q8acts_x", &x);
  const std::vector<uint8_t> want = golden_u8("q8acts_blocks");
  const int64_t T = 3, in = 288;
  ASSERT_EQ(x.size(), static_cast<size_t>(T * in));
  ASSERT_EQ(want.size(), static_cast<size_t>(T * in / 32 * 34));
  Q8Acts a;
  quantize_q8_0_acts(x.data(), T, in, a);
  ASSERT_EQ(a.nb, 9);
  ASSERT_EQ(a.nc, 3);
  const int64_t P = a.nc * 128;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < a.nb; ++b) {
      const uint8_t* blk = want.data() + (t * a.nb + b) * 34;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      ASSERT_EQ(a.d[static_cast<size_t>(t * (P / 32) + b)], f16_to_f32(h)) << "t " << t << " block " << b;
      for (int j = 0; j < 32; ++j)
        ASSERT_EQ(a.q[static_cast<size_t>(t * P + b * 32 + j)], static_cast<int8_t>(blk[2 + j])) << "t " << t << " block " << b << " j " << j;
    }
  // Layout invariants: padding blocks are zero; qg holds each block's halves; comp its sum in lane 0.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < a.nc * 4; ++b) {
      const int64_t c = b / 4, k = b % 4;
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) {
        const int8_t v = a.q[static_cast<size_t>(t * P + b * 32 + j)];
        if (b >= a.nb) {
          ASSERT_EQ(v, 0);
        }
        s += v;
        const int64_t g = c * 128 + (j < 16 ? k * 16 + j : 64 + k * 16 + j - 16);
        ASSERT_EQ(a.qg[static_cast<size_t>(t * P + g)], v);
      }
      for (int i = 0; i < 4; ++i) ASSERT_EQ(a.comp[static_cast<size_t>(t * (P / 8) + c * 16 + k * 4 + i)], i == 0 ? s : 0);
    }
}

// Random GGUF blocks with sane scales (fp16 d in ±[2^-10, 2^4); E8M0 near 2^0, plus the extremes).
std::vector<uint8_t> random_blocks(WeightFormat f, int64_t out, int64_t in, std::mt19937& rng) {
  const int64_t bb = gguf_block_bytes(f), n = out * in / 32;
  std::vector<uint8_t> data(static_cast<size_t>(n * bb));
  for (auto& v : data) v = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < n; ++blk) {
    uint8_t* p = data.data() + blk * bb;
    if (f == WeightFormat::kGgufMxfp4) {
      p[0] = static_cast<uint8_t>(blk == 0 ? 1 : blk == 1 ? 0 : 120 + rng() % 12);  // 2^-127, 2^-128: subnormal
    } else {
      const uint16_t h = static_cast<uint16_t>((rng() & 0x8000u) | ((5 + rng() % 14) << 10) | (rng() & 0x3ffu));
      std::memcpy(p, &h, 2);
    }
  }
  if (f == WeightFormat::kGgufQ8_0) data[2] = 0x80;  // −128: |w| = 128 must still work
  return data;
}

struct Case {
  WeightFormat format;
  int64_t in;
};

class GgufInt8Kernel : public ::testing::TestWithParam<Case> {};

TEST_P(GgufInt8Kernel, ScalarMatchesFp64AndSimdMatchesScalar) {
  const auto [format, in] = GetParam();
  const int64_t out = 37, T = 9;
  std::mt19937 rng(static_cast<unsigned>(in) * 7 + static_cast<unsigned>(format));
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = dist(rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(in + j)] = 0;  // token 1, block 0: all zero
  Q8Acts a;
  quantize_q8_0_acts(x.data(), T, in, a);
  const int64_t P = a.nc * 128;

  // fp64 reference on dequantized values, and Σ|w·x| for the tolerance.
  std::vector<double> ref(static_cast<size_t>(T * out)), mag(static_cast<size_t>(T * out)), magx(static_cast<size_t>(T * out));
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    decode_row(w, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0, m = 0, mx = 0;
      for (int64_t k = 0; k < in; ++k) {
        mx += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(t * in + k)]);
        const double xv = static_cast<double>(a.q[static_cast<size_t>(t * P + k)]) * a.d[static_cast<size_t>(t * (P / 32) + k / 32)];
        s += row[static_cast<size_t>(k)] * xv, m += std::fabs(row[static_cast<size_t>(k)] * xv);
      }
      ref[static_cast<size_t>(t * out + r)] = s, mag[static_cast<size_t>(t * out + r)] = m;
      magx[static_cast<size_t>(t * out + r)] = mx;
    }
  }
  std::vector<float> ys(static_cast<size_t>(T * out));
  gguf_int8_rows_scalar(w, a, ys.data(), out, 0, out);
  for (size_t i = 0; i < ys.size(); ++i) ASSERT_NEAR(ys[i], ref[i], 1e-6 * mag[i] + 1e-30) << "scalar " << i;

  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  std::vector<float> yv(static_cast<size_t>(T * out));
  gguf_int8_rows_avx512(w, a, yv.data(), out, 0, out);
  for (size_t i = 0; i < yv.size(); ++i) ASSERT_NEAR(yv[i], ys[i], 1e-5 * mag[i] + 1e-30) << "avx512 vs scalar " << i;
  // The generic AVX-512 chunk loader and the VBMI one (taken above when it applies) give the same bits.
  std::vector<float> yg(static_cast<size_t>(T * out));
  gguf_int8_rows_avx512(w, a, yg.data(), out, 0, out, /*vbmi=*/false);
  EXPECT_EQ(yg, yv) << "generic vs VBMI loader (VBMI applies: " << gguf_int8_vbmi_applies(w) << ")";

  // Batch and row-split invariance: token t alone, and rows cut at odd places, give the same bits.
  for (int64_t t = 0; t < T; ++t) {
    Q8Acts one;
    quantize_q8_0_acts(x.data() + t * in, 1, in, one);
    std::vector<float> y1(static_cast<size_t>(out));
    gguf_int8_rows_avx512(w, one, y1.data(), out, 0, 5);
    gguf_int8_rows_avx512(w, one, y1.data(), out, 5, 6);
    gguf_int8_rows_avx512(w, one, y1.data(), out, 6, out);
    for (int64_t r = 0; r < out; ++r) ASSERT_EQ(y1[static_cast<size_t>(r)], yv[static_cast<size_t>(t * out + r)]) << "t " << t << " r " << r;
  }

  // matmul(): int8 mode → this kernel (bitwise); mode off → the exact fp32-activation path.
  std::vector<float> ym(static_cast<size_t>(T * out));
  set_isa_override(Isa::kAvx512Vnni);
  set_gguf_int8(true);
  matmul(w, x.data(), T, ym.data());
  EXPECT_EQ(ym, yv);
  set_gguf_int8(false);
  matmul(w, x.data(), T, ym.data());
  std::vector<float> exact(static_cast<size_t>(T * out));
  matmul_reference(w, x.data(), T, exact.data());
  for (size_t i = 0; i < ym.size(); ++i) ASSERT_NEAR(ym[i], exact[i], 1e-5 * magx[i] + 1e-30) << "exact path " << i;
  set_gguf_int8(true);
  set_isa_override(std::nullopt);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.format == WeightFormat::kGgufQ8_0 ? "q8_0" : "mxfp4") + "_in" + std::to_string(info.param.in);
}

INSTANTIATE_TEST_SUITE_P(Formats, GgufInt8Kernel,
                         ::testing::Values(Case{WeightFormat::kGgufQ8_0, 32}, Case{WeightFormat::kGgufQ8_0, 96},
                                           Case{WeightFormat::kGgufQ8_0, 512}, Case{WeightFormat::kGgufMxfp4, 64},
                                           Case{WeightFormat::kGgufMxfp4, 288}, Case{WeightFormat::kGgufMxfp4, 512},
                                           Case{WeightFormat::kGgufMxfp4, 2304}),
                         case_name);

// The small-T AVX-512 kernel's arithmetic written out lane by lane (what both kernels must equal
// bitwise): per 128-element chunk, 16 int32 lanes (MXFP4: lanes 4k..4k+3 = block k, u8 codes
// u = 2·E2M1 + 12, and the block's whole −12·Σx in lane 4k; Q8_0: two halves, lanes 8j..8j+7 =
// block 2h+j), each lane acc = fma(float(p), d_w·d_x, acc) in chunk order, then _mm512_reduce_add_ps's
// pairing.
float lane_model(const WeightMatrix& w, const Q8Acts& a, int64_t r, int64_t t) {
  const bool q8 = w.format == WeightFormat::kGgufQ8_0;
  auto u8 = [](int code) { return kGgufE2M1Doubled[code] + 12; };  // MXFP4 code → u8
  const int64_t bb = gguf_block_bytes(w.format), P = a.nc * 128;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * a.nb * bb;
  const int8_t* q = a.q.data() + t * P;
  float acc[16] = {};
  for (int64_t c = 0; c < a.nc; ++c)
    for (int h = 0; h < (q8 ? 2 : 1); ++h)
      for (int l = 0; l < 16; ++l) {
        const int64_t b = q8 ? 4 * c + 2 * h + l / 8 : 4 * c + l / 4;
        int32_t p = 0;
        float dw = 0;
        if (b < a.nb) {
          const uint8_t* blk = row + b * bb;
          if (q8) {
            dw = gguf_load_f16(blk);
            for (int j = 0; j < 4; ++j) p += static_cast<int8_t>(blk[2 + (l % 8) * 4 + j]) * q[b * 32 + (l % 8) * 4 + j];
          } else {  // MXFP4: E8M0 scale at byte 0, codes from byte 1
            dw = gguf_e8m0_half(blk[0]);
            const int i = l % 4;
            for (int j = 0; j < 4; ++j)
              p += u8(blk[1 + 4 * i + j] & 15) * q[b * 32 + 4 * i + j] + u8(blk[1 + 4 * i + j] >> 4) * q[b * 32 + 16 + 4 * i + j];
            if (i == 0)
              for (int j = 0; j < 32; ++j) p -= 12 * q[b * 32 + j];
          }
        }
        acc[l] = std::fma(static_cast<float>(p), dw * a.d[static_cast<size_t>(t * (P / 32) + b)], acc[l]);
      }
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = acc[i + 8] + acc[i];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i + 4] + s8[i];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The small-T kernel at the token counts batched MoE decode gives an expert (1-8, and a few more):
// T = 1..11 covers every tail of 1-3 tokens (one register block of 1, 2 or 3 tokens on the VBMI loader,
// one-token passes on the generic one) after 0, 1 and 2 register blocks of 4; each token's
// outputs must be its bits alone with either chunk loader, rows cut at odd places, with the
// activations carrying their GEMM layout or not (the VBMI loader then reads a chunk's token side from
// it), and the lane model's (the scalar statement of the arithmetic).
TEST_P(GgufInt8Kernel, TailTokensInOneBlockKeepEachTokensBits) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  const auto [format, in] = GetParam();
  const int64_t out = 23, Tmax = 11;  // rows: 5 groups of 4 and 3 single rows
  std::mt19937 rng(static_cast<unsigned>(in) * 11 + static_cast<unsigned>(format));
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(Tmax * in));
  for (auto& v : x) v = dist(rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(2 * in + j)] = 0;  // token 2, block 0: all zero
  std::vector<float> alone(static_cast<size_t>(Tmax * out));
  for (int64_t t = 0; t < Tmax; ++t) {
    Q8Acts one;
    quantize_q8_0_acts(x.data() + t * in, 1, in, one);
    gguf_int8_rows_avx512(w, one, alone.data() + t * out, out, 0, out);
    for (int64_t r = 0; r < out; ++r)
      ASSERT_EQ(alone[static_cast<size_t>(t * out + r)], lane_model(w, one, r, 0)) << "t " << t << " r " << r;
  }
  for (const bool layout : {false, true})
    for (const bool vbmi : {true, false})
      for (int64_t T = 1; T <= Tmax; ++T) {
        Q8Acts a;
        q8_acts_prepare(a, T, in, false, layout && format == WeightFormat::kGgufQ8_0, layout && format == WeightFormat::kGgufMxfp4);
        q8_acts_fill(x.data(), 0, T, a);
        std::vector<float> y(static_cast<size_t>(T * out), -1.0f);
        gguf_int8_rows_avx512(w, a, y.data(), out, 0, 9, vbmi);
        gguf_int8_rows_avx512(w, a, y.data(), out, 9, 10, vbmi);
        gguf_int8_rows_avx512(w, a, y.data(), out, 10, out, vbmi);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < out; ++r)
            ASSERT_EQ(y[static_cast<size_t>(t * out + r)], alone[static_cast<size_t>(t * out + r)])
                << "layout " << layout << " vbmi " << vbmi << " T " << T << " t " << t << " r " << r;
      }
}

// gguf_int8_rows_at (routed MoE experts reading their tokens from one quantization of the layer input):
// each picked token's outputs are the bits it gets alone and the lane model's (the scalar statement of
// the arithmetic), for 1..11 picked tokens in any order and with repeats, either chunk
// loader, rows cut at odd places, with and without the activations' GEMM layout.
TEST_P(GgufInt8Kernel, PickedTokensKeepEachTokensBits) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  const auto [format, in] = GetParam();
  const int64_t out = 23, T = 11;
  std::mt19937 rng(static_cast<unsigned>(in) * 13 + static_cast<unsigned>(format));
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = dist(rng);
  Q8Acts plain, laid;
  quantize_q8_0_acts(x.data(), T, in, plain);
  q8_acts_prepare(laid, T, in, false, format == WeightFormat::kGgufQ8_0, format == WeightFormat::kGgufMxfp4);
  q8_acts_fill(x.data(), 0, T, laid);
  std::vector<float> alone(static_cast<size_t>(T * out));
  for (int64_t t = 0; t < T; ++t) {
    Q8Acts one;
    quantize_q8_0_acts(x.data() + t * in, 1, in, one);
    gguf_int8_rows_avx512(w, one, alone.data() + t * out, out, 0, out);
  }
  const std::vector<std::vector<int32_t>> picks = {
      {5}, {3, 3}, {10, 0, 7}, {9, 1, 4, 2}, {1, 2, 4, 8, 9}, {6, 5, 4, 3, 2, 1, 0, 10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}};
  for (const Q8Acts* acts : {&plain, &laid})
    for (const bool vbmi : {true, false})
      for (const auto& tok : picks) {
        const Q8Acts& all = *acts;
        const int64_t n = static_cast<int64_t>(tok.size());
        std::vector<float> y(static_cast<size_t>(n * out), -1.0f);
        gguf_int8_rows_at(w, all, tok.data(), n, y.data(), out, 0, 9, vbmi);
        gguf_int8_rows_at(w, all, tok.data(), n, y.data(), out, 9, 10, vbmi);
        gguf_int8_rows_at(w, all, tok.data(), n, y.data(), out, 10, out, vbmi);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < out; ++r) {
            const float got = y[static_cast<size_t>(i * out + r)];
            ASSERT_EQ(got, alone[static_cast<size_t>(tok[static_cast<size_t>(i)] * out + r)])
                << "layout " << (acts == &laid) << " vbmi " << vbmi << " n " << n << " i " << i << " r " << r;
            ASSERT_EQ(got, lane_model(w, all, r, tok[static_cast<size_t>(i)])) << "n " << n << " i " << i << " r " << r;
          }
      }
}

// The AVX2 kernel (CPUs without AVX-512 VNNI) states the same arithmetic with vpmaddubsw/vpmaddwd on two
// ymm halves: every token's outputs equal the lane model's bit for bit (hence the AVX-512 kernel's, which
// the tests above hold to the same model), for 1..11 tokens together, tokens picked by index (any order,
// repeats), rows cut at odd places; and matmul() takes it when the active ISA is AVX2.
TEST_P(GgufInt8Kernel, Avx2KernelEqualsTheLaneModel) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2 path: " << isa_unsupported_reason(Isa::kAvx2);
  const auto [format, in] = GetParam();
  const int64_t out = 23, Tmax = 11;
  std::mt19937 rng(static_cast<unsigned>(in) * 17 + static_cast<unsigned>(format));
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(Tmax * in));
  for (auto& v : x) v = dist(rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(2 * in + j)] = 0;  // token 2, block 0: all zero
  Q8Acts all;
  quantize_q8_0_acts(x.data(), Tmax, in, all);
  for (int64_t T = 1; T <= Tmax; ++T) {
    Q8Acts a;
    quantize_q8_0_acts(x.data(), T, in, a);
    std::vector<float> y(static_cast<size_t>(T * out), -1.0f);
    gguf_int8_rows_avx2(w, a, y.data(), out, 0, 9);
    gguf_int8_rows_avx2(w, a, y.data(), out, 9, 10);
    gguf_int8_rows_avx2(w, a, y.data(), out, 10, out);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(y[static_cast<size_t>(t * out + r)], lane_model(w, a, r, t)) << "T " << T << " t " << t << " r " << r;
  }
  const std::vector<std::vector<int32_t>> picks = {{5}, {3, 3}, {10, 0, 7}, {9, 1, 4, 2}, {6, 5, 4, 3, 2, 1, 0, 10}};
  for (const auto& tok : picks) {
    const int64_t n = static_cast<int64_t>(tok.size());
    std::vector<float> y(static_cast<size_t>(n * out), -1.0f);
    gguf_int8_rows_at_avx2(w, all, tok.data(), n, y.data(), out, 0, 9);
    gguf_int8_rows_at_avx2(w, all, tok.data(), n, y.data(), out, 9, out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(y[static_cast<size_t>(i * out + r)], lane_model(w, all, r, tok[static_cast<size_t>(i)])) << "n " << n << " i " << i;
  }
  // matmul() in int8 mode with AVX2 active: this kernel below the GEMM threshold (kGgufGemmMinTokensAvx2).
  set_isa_override(Isa::kAvx2);
  set_gguf_int8(true);
  EXPECT_TRUE(gguf_int8_applies(w));
  for (const int64_t T : {int64_t{1}, int64_t{4}, Tmax}) {
    std::vector<float> ym(static_cast<size_t>(T * out));
    matmul(w, x.data(), T, ym.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(ym[static_cast<size_t>(t * out + r)], lane_model(w, all, r, t)) << "matmul T " << T << " t " << t;
  }
  set_isa_override(Isa::kScalar);
  EXPECT_FALSE(gguf_int8_applies(w)) << "a forced scalar ISA turns the int8 mode off";
  set_isa_override(std::nullopt);
}

// q8_acts_fill_chunks: a row quantized stripe by stripe (128-element chunks, in any order, the last chunk
// partial) gives every array of the whole-row quantization, GEMM layouts included, bit for bit.
TEST(GgufInt8, ChunkStripesQuantizeAsWholeRows) {
  for (const int64_t in : {32, 384, 416}) {
    SCOPED_TRACE(in);
    const int64_t T = 3;
    std::mt19937 rng(static_cast<unsigned>(in));
    std::uniform_real_distribution<float> dist(-3, 3);
    std::vector<float> x(static_cast<size_t>(T * in));
    for (auto& v : x) v = dist(rng);
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(in + j)] = 0;  // token 1, block 0: all zero
    Q8Acts whole, striped;
    q8_acts_prepare(whole, T, in, true, true, true);
    q8_acts_fill(x.data(), 0, T, whole);
    q8_acts_prepare(striped, T, in, true, true, true);
    const int64_t nc = striped.nc;
    std::vector<int64_t> order;  // odd chunks descending, then even chunks ascending
    for (int64_t c = nc - 1; c >= 0; --c) {
      if (c % 2 == 1) order.push_back(c);
    }
    for (int64_t c = 0; c < nc; c += 2) order.push_back(c);
    for (int64_t t = T - 1; t >= 0; --t)
      for (const int64_t c : order) q8_acts_fill_chunks(x.data() + t * in, t, c, c + 1, striped);
    const size_t P = static_cast<size_t>(T * nc * 128);
    auto same = [](const auto& a, const auto& b, size_t n) { return std::memcmp(a.data(), b.data(), n * sizeof(a[0])) == 0; };
    EXPECT_TRUE(same(whole.q, striped.q, P));
    EXPECT_TRUE(same(whole.qg, striped.qg, P));
    EXPECT_TRUE(same(whole.comp, striped.comp, P / 8));
    EXPECT_TRUE(same(whole.d, striped.d, P / 32));
    EXPECT_TRUE(same(whole.n4, striped.n4, P / 8));
    EXPECT_TRUE(same(whole.n12, striped.n12, P / 8));
    EXPECT_TRUE(same(whole.dx4, striped.dx4, P / 8));
    EXPECT_TRUE(same(whole.n8, striped.n8, P / 4));
    EXPECT_TRUE(same(whole.dx8, striped.dx8, P / 4));
  }
}

class GgufInt8Gemm : public ::testing::TestWithParam<Case> {};

void prepare_for(Q8Acts& a, WeightFormat f, int64_t T, int64_t in) {
  q8_acts_prepare(a, T, in, false, f == WeightFormat::kGgufQ8_0, f == WeightFormat::kGgufMxfp4);
}

// The prefill GEMM form (gguf_int8_gemm_rows) gives the small-T kernel's bits for every token at every
// T = 1..70, rows cut at odd places, and the lane model's bits; matmul() takes it from
// kGgufGemmMinTokens tokens on, still with the small-T bits.
TEST_P(GgufInt8Gemm, SameBitsAsSmallTKernelAtEveryT) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  const auto [format, in] = GetParam();
  const int64_t out = 133, Tmax = 70;  // rows 22..133: one stripe of 64 rows, then 47 (11 groups of 4, 3 single rows)
  std::mt19937 rng(static_cast<unsigned>(in) * 13 + static_cast<unsigned>(format));
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(Tmax * in));
  for (auto& v : x) v = dist(rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(in + j)] = 0;  // token 1, block 0: all zero
  // Per-token reference: each token alone through the small-T kernel.
  std::vector<float> ref(static_cast<size_t>(Tmax * out));
  for (int64_t t = 0; t < Tmax; ++t) {
    Q8Acts one;
    quantize_q8_0_acts(x.data() + t * in, 1, in, one);
    gguf_int8_rows_avx512(w, one, ref.data() + t * out, out, 0, out);
    for (int64_t r = 0; r < out; ++r)
      ASSERT_EQ(ref[static_cast<size_t>(t * out + r)], lane_model(w, one, r, 0)) << "small-T kernel vs lane model, t " << t << " r " << r;
  }
  Q8Acts a;
  for (int64_t T = 1; T <= Tmax; ++T) {
    prepare_for(a, format, T, in);
    q8_acts_fill(x.data(), 0, T, a);
    std::vector<float> y(static_cast<size_t>(T * out), -1.0f);
    gguf_int8_gemm_rows(w, a, y.data(), out, 0, 17);  // row ranges cut where matmul_many never cuts (not ×4)
    gguf_int8_gemm_rows(w, a, y.data(), out, 17, 22);
    gguf_int8_gemm_rows(w, a, y.data(), out, 22, out);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(y[static_cast<size_t>(t * out + r)], ref[static_cast<size_t>(t * out + r)]) << "T " << T << " t " << t << " r " << r;
  }
  // matmul() at T ≥ the GEMM threshold (the GEMM form) and below it: the same bits per token.
  set_isa_override(Isa::kAvx512Vnni);
  set_gguf_int8(true);
  const int64_t min_t = std::min(gguf_int8_gemm_min_tokens(format), Tmax);
  for (const int64_t T : {min_t - 1, min_t, Tmax}) {
    std::vector<float> ym(static_cast<size_t>(T * out));
    matmul(w, x.data(), T, ym.data());
    for (size_t i = 0; i < ym.size(); ++i) ASSERT_EQ(ym[i], ref[i]) << "matmul T " << T << " i " << i;
  }
  set_isa_override(std::nullopt);
}

uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }

using RowsFn = void (*)(const WeightMatrix&, const Q8Acts&, float*, int64_t, int64_t, int64_t);
using RowsAtFn = void (*)(const WeightMatrix&, const Q8Acts&, const int32_t*, int64_t, float*, int64_t, int64_t,
                            int64_t);

// `n` tokens picked by index (any order, repeats) from one quantization of T = 50, rows cut at 9 and 10: every
// picked token's outputs from `gemm_at` have the bits `small_t` gives that token alone.
void picked_tokens_keep_each_tokens_bits(WeightFormat format, int64_t in, unsigned seed, RowsFn small_t,
                                         RowsAtFn gemm_at, const std::vector<int64_t>& ns) {
  const int64_t out = 71, T = 50;
  std::mt19937 rng(seed);
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = dist(rng);
  Q8Acts all;
  prepare_for(all, format, T, in);
  q8_acts_fill(x.data(), 0, T, all);
  std::vector<float> alone(static_cast<size_t>(T * out));
  for (int64_t t = 0; t < T; ++t) {
    Q8Acts one;
    quantize_q8_0_acts(x.data() + t * in, 1, in, one);
    small_t(w, one, alone.data() + t * out, out, 0, out);
  }
  for (const int64_t n : ns) {
    std::vector<int32_t> tok(static_cast<size_t>(n));
    for (auto& v : tok) v = static_cast<int32_t>(rng() % T);
    std::vector<float> y(static_cast<size_t>(n * out), -1.0f);
    gemm_at(w, all, tok.data(), n, y.data(), out, 0, 9);
    gemm_at(w, all, tok.data(), n, y.data(), out, 9, 10);
    gemm_at(w, all, tok.data(), n, y.data(), out, 10, out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(bits(y[static_cast<size_t>(i * out + r)]), bits(alone[static_cast<size_t>(tok[static_cast<size_t>(i)] * out + r)]))
            << "n " << n << " i " << i << " r " << r;
  }
}

// gguf_int8_gemm_rows_at (the routed MoE experts at prefill): tokens picked by index from one quantization,
// in any order and with repeats, 16..70 of them, rows cut at odd places: each picked token's outputs are
// its small-T bits alone.
TEST_P(GgufInt8Gemm, PickedTokensKeepEachTokensBits) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  const auto [format, in] = GetParam();
  picked_tokens_keep_each_tokens_bits(
      format, in, static_cast<unsigned>(in) * 17 + static_cast<unsigned>(format),
      [](const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
        gguf_int8_rows_avx512(w, a, y, ldy, r0, r1);
      },
      gguf_int8_gemm_rows_at, {16, 17, 23, 41, 70});
}


// The AVX2 prefill form (gguf_int8_gemm_rows_avx2, CPUs without AVX-512 VNNI) gives every token the bits
// the AVX2 small-T kernel gives it alone, which are the lane model's (hence the AVX-512 kernels'): at T
// below, at and above kGgufGemmMinTokensAvx2 (whole and partial register tiles and token blocks), rows cut
// at odd places (whole and partial stripes, row groups and single rows); matmul() on the AVX2 ISA takes it
// from the threshold on, with the same bits.
TEST_P(GgufInt8Gemm, Avx2FormEqualsTheSmallTKernelAtEveryT) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2 path: " << isa_unsupported_reason(Isa::kAvx2);
  const auto [format, in] = GetParam();
  const int64_t out = 133, Tmax = 129, thr = kGgufGemmMinTokensAvx2;
  std::mt19937 rng(static_cast<unsigned>(in) * 29 + static_cast<unsigned>(format));
  const std::vector<uint8_t> data = random_blocks(format, out, in, rng);
  WeightMatrix w;
  w.format = format, w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(Tmax * in));
  for (auto& v : x) v = dist(rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(in + j)] = 0;  // token 1, block 0: all zero
  std::vector<float> ref(static_cast<size_t>(Tmax * out));
  for (int64_t t = 0; t < Tmax; ++t) {
    Q8Acts one;
    quantize_q8_0_acts(x.data() + t * in, 1, in, one);
    gguf_int8_rows_avx2(w, one, ref.data() + t * out, out, 0, out);
    for (int64_t r = 0; r < out; ++r)
      ASSERT_EQ(bits(ref[static_cast<size_t>(t * out + r)]), bits(lane_model(w, one, r, 0))) << "small-T vs lane model, t " << t << " r " << r;
  }
  Q8Acts a;
  for (const int64_t T : {int64_t{1}, int64_t{2}, int64_t{5}, thr - 1, thr, thr + 1, int64_t{37}, int64_t{70}, Tmax}) {
    prepare_for(a, format, T, in);
    q8_acts_fill(x.data(), 0, T, a);
    std::vector<float> y(static_cast<size_t>(T * out), -1.0f);
    gguf_int8_gemm_rows_avx2(w, a, y.data(), out, 0, 17);
    gguf_int8_gemm_rows_avx2(w, a, y.data(), out, 17, 22);
    gguf_int8_gemm_rows_avx2(w, a, y.data(), out, 22, out);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < out; ++r)
        ASSERT_EQ(bits(y[static_cast<size_t>(t * out + r)]), bits(ref[static_cast<size_t>(t * out + r)])) << "T " << T << " t " << t << " r " << r;
  }
  set_isa_override(Isa::kAvx2);
  set_gguf_int8(true);
  EXPECT_FALSE(gguf_int8_gemm_applies(format, thr - 1));
  EXPECT_TRUE(gguf_int8_gemm_applies(format, thr)) << "the AVX2 GEMM form from its threshold on";
  for (const int64_t T : {thr - 1, thr, Tmax}) {
    std::vector<float> ym(static_cast<size_t>(T * out));
    matmul(w, x.data(), T, ym.data());
    for (size_t i = 0; i < ym.size(); ++i) ASSERT_EQ(bits(ym[i]), bits(ref[i])) << "matmul T " << T << " i " << i;
  }
  set_isa_override(std::nullopt);
}

// gguf_int8_gemm_rows_at_avx2: tokens picked by index from one quantization, any order, repeats, below
// and above the threshold, rows cut at odd places: each picked token's outputs are its small-T bits alone.
TEST_P(GgufInt8Gemm, Avx2PickedTokensKeepEachTokensBits) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2 path: " << isa_unsupported_reason(Isa::kAvx2);
  const auto [format, in] = GetParam();
  picked_tokens_keep_each_tokens_bits(format, in, static_cast<unsigned>(in) * 31 + static_cast<unsigned>(format),
                                      gguf_int8_rows_avx2, gguf_int8_gemm_rows_at_avx2,
                                      {3, kGgufGemmMinTokensAvx2 - 1, kGgufGemmMinTokensAvx2, 23, 41, 70});
}

INSTANTIATE_TEST_SUITE_P(Formats, GgufInt8Gemm,
                         ::testing::Values(Case{WeightFormat::kGgufQ8_0, 32}, Case{WeightFormat::kGgufQ8_0, 96},
                                           Case{WeightFormat::kGgufQ8_0, 512}, Case{WeightFormat::kGgufQ8_0, 2304},
                                           Case{WeightFormat::kGgufMxfp4, 32}, Case{WeightFormat::kGgufMxfp4, 288},
                                           Case{WeightFormat::kGgufMxfp4, 512}, Case{WeightFormat::kGgufMxfp4, 2304}),
                         case_name);

// One input shared by a Q4_0 (with its packed rows), a Q8_0 and an MXFP4 product in one matmul_many call
// (as q/k/v or gate/up share theirs) on `isa` (the GEMM form at T = 70 for Q8_0 and MXFP4; Q4_0's packed
// kernel at every T): the input is quantized once with the layouts all three need, and each product keeps
// its own bits: Q4_0 the packed lane model's (q4_x16_rows_model), Q8_0 and MXFP4 that ISA's small-T
// kernel's.
void shared_input_serves_every_format(Isa isa, RowsFn small_t, uint32_t seed) {
  const int64_t in = 512, out = 70, T = 70;
  std::mt19937 rng(seed);
  const WeightFormat fs[3] = {WeightFormat::kGgufQ4_0, WeightFormat::kGgufQ8_0, WeightFormat::kGgufMxfp4};
  std::vector<uint8_t> d[3];
  WeightMatrix w[3];
  for (int i = 0; i < 3; ++i) {
    d[i] = random_blocks(fs[i], out, in, rng);
    w[i].format = fs[i], w[i].out = out, w[i].in = in, w[i].data = d[i].data();
  }
  const AlignedVector<uint8_t> p = pack_q4_0_x16(w[0]);
  w[0].packed = p.data();
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = dist(rng);
  set_isa_override(isa);
  set_gguf_int8(true);
  ASSERT_TRUE(gguf_int8_gemm_applies(fs[1], T) && gguf_int8_gemm_applies(fs[2], T));
  std::vector<float> y[3];
  MatmulTask tasks[3];
  for (int i = 0; i < 3; ++i) {
    y[i].resize(static_cast<size_t>(T * out));
    tasks[i] = {&w[i], x.data(), T, y[i].data(), 0};
  }
  matmul_many(std::span<const MatmulTask>(tasks, 3));
  set_isa_override(std::nullopt);
  Q8Acts a;
  q8_acts_prepare(a, T, in, /*gemm_q4=*/true);  // the packed Q4_0 kernels' input (the others read none of it)
  q8_acts_fill(x.data(), 0, T, a);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> r(static_cast<size_t>(T * out));
    if (fs[i] == WeightFormat::kGgufQ4_0) q4_x16_rows_model(w[i], a, nullptr, T, r.data(), out, 0, out);
    else small_t(w[i], a, r.data(), out, 0, out);
    for (size_t k = 0; k < r.size(); ++k) ASSERT_EQ(bits(y[i][k]), bits(r[k])) << "format " << i << " k " << k;
  }
}

// A GEMM form refuses activations quantized without its layout, a token index out of range and other
// formats, Q4_0 included (it runs on its packed rows, even with its layout prepared).
void refuses_unprepared_activations(RowsFn gemm, RowsAtFn gemm_at) {
  std::mt19937 rng(5);
  const std::vector<uint8_t> data = random_blocks(WeightFormat::kGgufQ8_0, 4, 128, rng);  // the largest blocks
  WeightMatrix w;
  w.format = WeightFormat::kGgufMxfp4, w.out = 4, w.in = 128, w.data = data.data();
  const std::vector<float> x(128, 1.0f);
  Q8Acts a;
  quantize_q8_0_acts(x.data(), 1, 128, a);
  std::vector<float> y(4);
  EXPECT_DEATH(gemm(w, a, y.data(), 4, 0, 4), "MXFP4 GEMM layout");
  w.format = WeightFormat::kGgufQ8_0;
  EXPECT_DEATH(gemm(w, a, y.data(), 4, 0, 4), "Q8_0 GEMM layout");
  q8_acts_prepare(a, 1, 128, true, false, true);  // the other two layouts only
  q8_acts_fill(x.data(), 0, 1, a);
  EXPECT_DEATH(gemm(w, a, y.data(), 4, 0, 4), "Q8_0 GEMM layout");
  const int32_t bad = 1;
  w.format = WeightFormat::kGgufMxfp4;
  EXPECT_DEATH(gemm_at(w, a, &bad, 1, y.data(), 4, 0, 4), "token index out of range");
  w.format = WeightFormat::kBF16;
  EXPECT_DEATH(gemm(w, a, y.data(), 4, 0, 4), "Q8_0 / MXFP4 only");
  w.format = WeightFormat::kGgufQ4_0;
  EXPECT_DEATH(gemm(w, a, y.data(), 4, 0, 4), "Q4_0 runs on its packed rows");
}

TEST(GgufInt8Gemm, SharedInputServesEveryFormat) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  shared_input_serves_every_format(
      Isa::kAvx512Vnni,
      [](const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
        gguf_int8_rows_avx512(w, a, y, ldy, r0, r1);
      },
      11);
}

TEST(GgufInt8Gemm, RefusesUnpreparedActivations) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "AVX-512 VNNI path: " << isa_unsupported_reason(Isa::kAvx512Vnni);
  refuses_unprepared_activations(gguf_int8_gemm_rows, gguf_int8_gemm_rows_at);
}

TEST(GgufInt8Gemm, Avx2SharedInputServesEveryFormat) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2 path: " << isa_unsupported_reason(Isa::kAvx2);
  shared_input_serves_every_format(Isa::kAvx2, gguf_int8_rows_avx2, 13);
}

TEST(GgufInt8Gemm, Avx2RefusesUnpreparedActivations) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "AVX2 path: " << isa_unsupported_reason(Isa::kAvx2);
  refuses_unprepared_activations(gguf_int8_gemm_rows_avx2, gguf_int8_gemm_rows_at_avx2);
}

// The Q8_0 / MXFP4 kernels (small-T and GEMM, AVX-512 and AVX2, and the scalar reference) refuse a Q4_0
// matrix, even one with its packed rows: Q4_0 runs on the packed kernels only (gguf_q4_x16.h), which
// gguf_int8_product routes it to. No GEMM form or VBMI loader is offered for it either.
TEST(GgufInt8, Q8AndMxfp4KernelsRefuseQ4_0) {
  const int64_t out = 16, in = 128;
  std::mt19937 rng(7);
  const std::vector<uint8_t> data = random_blocks(WeightFormat::kGgufQ4_0, out, in, rng);
  WeightMatrix w;
  w.format = WeightFormat::kGgufQ4_0, w.out = out, w.in = in, w.data = data.data();
  const AlignedVector<uint8_t> p = pack_q4_0_x16(w);
  w.packed = p.data();
  const std::vector<float> x(static_cast<size_t>(in), 1.0f);
  Q8Acts a;
  q8_acts_prepare(a, 1, in, true, true, true);  // every layout: the refusal is about the format
  q8_acts_fill(x.data(), 0, 1, a);
  std::vector<float> y(static_cast<size_t>(out));
  const int32_t tok = 0;
  EXPECT_FALSE(gguf_int8_gemm_format(w.format));
  EXPECT_FALSE(gguf_int8_gemm_prepared(w, a));
  EXPECT_FALSE(gguf_int8_vbmi_applies(w));
  EXPECT_DEATH(gguf_int8_rows_scalar(w, a, y.data(), out, 0, out), "Q4_0's reference is q4_x16_rows_model");
  if (isa_supported(Isa::kAvx512Vnni)) {
    for (const bool vbmi : {true, false}) {
      EXPECT_DEATH(gguf_int8_rows_avx512(w, a, y.data(), out, 0, out, vbmi), "Q4_0 runs on its packed rows");
      EXPECT_DEATH(gguf_int8_rows_at(w, a, &tok, 1, y.data(), out, 0, out, vbmi), "Q4_0 runs on its packed rows");
    }
    EXPECT_DEATH(gguf_int8_gemm_rows(w, a, y.data(), out, 0, out), "Q4_0 runs on its packed rows");
    EXPECT_DEATH(gguf_int8_gemm_rows_at(w, a, &tok, 1, y.data(), out, 0, out), "Q4_0 runs on its packed rows");
  }
  if (isa_supported(Isa::kAvx2)) {
    EXPECT_DEATH(gguf_int8_rows_avx2(w, a, y.data(), out, 0, out), "Q4_0 runs on its packed rows");
    EXPECT_DEATH(gguf_int8_rows_at_avx2(w, a, &tok, 1, y.data(), out, 0, out), "Q4_0 runs on its packed rows");
    EXPECT_DEATH(gguf_int8_gemm_rows_avx2(w, a, y.data(), out, 0, out), "Q4_0 runs on its packed rows");
    EXPECT_DEATH(gguf_int8_gemm_rows_at_avx2(w, a, &tok, 1, y.data(), out, 0, out), "Q4_0 runs on its packed rows");
  }
  // What the int8 mode runs for it instead: the packed kernel, at every T (no GEMM threshold).
  if (isa_supported(Isa::kAvx512Vnni) || isa_supported(Isa::kAvx2)) {
    set_gguf_int8(true);
    EXPECT_FALSE(gguf_int8_gemm_applies(w.format, 512));
    std::vector<float> want(static_cast<size_t>(out));
    q4_x16_rows_model(w, a, nullptr, 1, want.data(), out, 0, out);
    gguf_int8_product(w, a, y.data(), out, 0, out);
    for (int64_t r = 0; r < out; ++r) ASSERT_EQ(bits(y[static_cast<size_t>(r)]), bits(want[static_cast<size_t>(r)])) << "r " << r;
  }
}

TEST(GgufInt8, ModeFollowsSwitchAndIsa) {
  WeightMatrix w;
  w.format = WeightFormat::kGgufMxfp4;
  set_gguf_int8(true);
  set_isa_override(Isa::kScalar);
  EXPECT_FALSE(gguf_int8_applies(w)) << "no int8 mode on the scalar ISA";
  if (isa_supported(Isa::kAvx2)) {
    set_isa_override(Isa::kAvx2);
    EXPECT_TRUE(gguf_int8_applies(w)) << "the AVX2 kernel runs the int8 mode";
    EXPECT_TRUE(gguf_int8_gemm_applies(w.format, 64)) << "the AVX2 GEMM form runs prefill";
    EXPECT_FALSE(gguf_int8_gemm_applies(w.format, kGgufGemmMinTokensAvx2 - 1));
    EXPECT_EQ(gguf_int8_gemm_min_tokens(w.format), kGgufGemmMinTokensAvx2);
  }
  set_isa_override(std::nullopt);
  set_gguf_int8(false);
  EXPECT_FALSE(gguf_int8_applies(w));
  set_gguf_int8(true);
  EXPECT_EQ(gguf_int8_applies(w), active_isa() != Isa::kScalar);
  w.format = WeightFormat::kBF16;
  EXPECT_FALSE(gguf_int8_applies(w));
}

}  // namespace
}  // namespace kestrel::kernels
