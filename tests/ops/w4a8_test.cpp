// Int8-activation kernels (W4A8 int4 and MXFP4 × int8) and the W4A8 weight format.
//
// 1. Format: our int4 quantizer/packer/dequantizer against compressed-tensors' own
//    calculate_qparams + PackedQuantizationCompressor (tools/gen_w4a8_goldens.py): bit-exact.
// 2. Paths: every ISA path the CPU can run (dispatcher forced onto it), plus the AMX kernel with
//    emulated tiles, against the scalar reference:
//      - exact (bitwise) when every scale is one power of two: then each path's int32 partial sums
//        are exactly representable and summed exactly in fp32, so any order gives the same bits;
//      - general scales: |Δ| ≤ 1e-5 · Σ|w·x| (fp32 reassociation only: the int32 group sums are
//        exact on every path, the lanes are summed in a different order);
//      - per-token results do not depend on the batch size (the scheduler's batch invariance).
//    Paths this CPU cannot run are skipped with the reason (GTEST_SKIP).
// 3. Against the fp32 reference (dequantized weights × fp32 activations): NMSE ≤ 3e-4. Expected
//    size: per-token int8 rounding adds noise of variance s²/12 per element with s = absmax/127; for
//    Gaussian x over ≤ 416 elements absmax ≈ 3.3σ, so NMSE ≈ (3.3/127)²/12 ≈ 6e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/w4a8_format.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "kernels/cpu/w4a8_isa.h"
#include "loader/safetensors.h"

namespace kestrel::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// 1. Format vs compressed-tensors
// ---------------------------------------------------------------------------------------------
template <typename T>
std::vector<T> tensor(const SafetensorsFile& f, const std::string& name, DType dt, std::vector<int64_t>* shape = nullptr) {
  for (const auto& e : f.header().entries)
    if (e.name == name) {
      TensorView tv = f.view(e);
      EXPECT_EQ(tv.dtype, dt) << name;
      if (shape) *shape = tv.shape;
      std::vector<T> v(static_cast<size_t>(tv.numel()));
      std::memcpy(v.data(), tv.data, v.size() * sizeof(T));
      return v;
    }
  ADD_FAILURE() << "missing " << name;
  return {};
}

TEST(W4A8Format, QuantizePackDequantMatchCompressedTensors) {
  auto f = SafetensorsFile::open(std::string(KESTREL_TEST_DATA) + "/ops/w4a8_pack.safetensors");
  ASSERT_TRUE(f) << f.error().message();
  std::vector<int64_t> shape;
  const auto wbits = tensor<uint16_t>(*f, "weight", DType::kBF16, &shape);
  ASSERT_EQ(shape.size(), 2u);
  const int64_t out = shape[0], in = shape[1];
  const auto codes = tensor<int8_t>(*f, "codes", DType::kI8);
  for (int64_t G : {32, 64, 128}) {
    SCOPED_TRACE("group " + std::to_string(G));
    const auto packed = tensor<uint32_t>(*f, "packed_g" + std::to_string(G), DType::kI32);
    const auto scale = tensor<uint16_t>(*f, "scale_g" + std::to_string(G), DType::kBF16);
    const auto deq = tensor<float>(*f, "dequant_g" + std::to_string(G), DType::kF32);
    const auto deq16 = tensor<uint16_t>(*f, "dequant_bf16_g" + std::to_string(G), DType::kBF16);
    std::vector<float> row(static_cast<size_t>(in)), back(static_cast<size_t>(in));
    std::vector<uint32_t> words(static_cast<size_t>(in / 8));
    std::vector<uint16_t> sc(static_cast<size_t>(in / G));
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t k = 0; k < in; ++k) row[static_cast<size_t>(k)] = bf16_to_f32(wbits[static_cast<size_t>(r * in + k)]);
      quantize_int4_row(row.data(), in, G, words.data(), sc.data());
      for (int64_t w = 0; w < in / 8; ++w) ASSERT_EQ(words[static_cast<size_t>(w)], packed[static_cast<size_t>(r * in / 8 + w)]) << "row " << r << " word " << w;
      for (int64_t g = 0; g < in / G; ++g) ASSERT_EQ(sc[static_cast<size_t>(g)], scale[static_cast<size_t>(r * in / G + g)]) << "row " << r << " group " << g;
      const auto* bytes = reinterpret_cast<const uint8_t*>(packed.data() + r * in / 8);
      if (G == 32) {
        for (int64_t k = 0; k < in; ++k) ASSERT_EQ(int4_at(bytes, k), codes[static_cast<size_t>(r * in + k)]) << r << "," << k;
      }
      dequantize_int4_row(bytes, scale.data() + r * in / G, in, G, back.data());
      for (int64_t k = 0; k < in; ++k) {
        ASSERT_EQ(back[static_cast<size_t>(k)], deq[static_cast<size_t>(r * in + k)]) << r << "," << k;
        // compressed-tensors' shipped dequant multiplies in bf16: one rounding of our exact product.
        ASSERT_EQ(f32_to_bf16(back[static_cast<size_t>(k)]), deq16[static_cast<size_t>(r * in + k)]) << r << "," << k;
      }
    }
    // decode_row through the WeightMatrix hook gives the same values.
    WeightMatrix wm;
    wm.format = WeightFormat::kW4A8, wm.out = out, wm.in = in, wm.group = G;
    wm.data = packed.data(), wm.scales = reinterpret_cast<const uint8_t*>(scale.data());
    decode_row(wm, 3, back.data());
    for (int64_t k = 0; k < in; ++k) ASSERT_EQ(back[static_cast<size_t>(k)], deq[static_cast<size_t>(3 * in + k)]);
  }
}

TEST(W4A8Format, ActivationQuantization) {
  const int64_t T = 3, in = 160;  // one full 128-chunk + one 32-element tail chunk
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = d(rng);
  for (int64_t k = 0; k < in; ++k) x[static_cast<size_t>(2 * in + k)] = 0;  // all-zero token
  QuantizedActs a;
  quantize_activations(x.data(), T, in, a);
  std::vector<int> seen(static_cast<size_t>(in));
  for (int64_t k = 0; k < in; ++k) ++seen[static_cast<size_t>(simd_order_index(k, in))];
  for (int c : seen) ASSERT_EQ(c, 1);  // a permutation
  for (int64_t t = 0; t < T; ++t) {
    float amax = 0;
    for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * in + k)]));
    const float s = a.scale[static_cast<size_t>(t)];
    EXPECT_EQ(s, amax / 127.0f);
    int max_q = 0;
    for (int64_t k = 0; k < in; ++k) {
      const int q = a.q[static_cast<size_t>(t * in + k)];
      max_q = std::max(max_q, std::abs(q));
      EXPECT_LE(std::fabs(q * s - x[static_cast<size_t>(t * in + k)]), 0.5f * s * (1 + 1e-5f) + 1e-30f);
      EXPECT_EQ(a.qp[static_cast<size_t>(t * in + simd_order_index(k, in))], q);
    }
    EXPECT_EQ(max_q, t == 2 ? 0 : 127);
    for (int64_t w = 0; w < in / 8; ++w) {
      int sum = 0;
      for (int64_t k = 0; k < 8; ++k) sum += a.q[static_cast<size_t>(t * in + 8 * w + k)];
      EXPECT_EQ(a.wsum[static_cast<size_t>(t * (in / 8) + w)], sum);
    }
  }
  // SIMD order: within a 128-chunk evens first; the tail chunk [16 even, 16 odd].
  EXPECT_EQ(simd_order_index(1, in), 64);
  EXPECT_EQ(simd_order_index(2, in), 1);
  EXPECT_EQ(simd_order_index(129, in), 144);
}

// ---------------------------------------------------------------------------------------------
// 2. Paths vs scalar
// ---------------------------------------------------------------------------------------------
struct Mat {
  std::vector<uint8_t> packed, scales;
  WeightMatrix w;
};

// `exact`: one power-of-two scale everywhere (see the file comment).
Mat random_matrix(WeightFormat f, int64_t out, int64_t in, int64_t G, bool exact, uint32_t seed) {
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
      const uint16_t s = f32_to_bf16(exact ? 0.015625f : d(rng));
      std::memcpy(m.scales.data() + 2 * i, &s, 2);
    }
  } else {
    m.scales.resize(static_cast<size_t>(out * in / 32));
    for (auto& s : m.scales) s = static_cast<uint8_t>(exact ? 121 : 116 + rng() % 12);
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

// A path: a supported ISA through the dispatcher, or the emulated AMX kernel.
// kAmx: the dispatcher on an AMX machine (it runs the VNNI kernels); kAmxTiles: the tile kernel on the hardware.
enum class Path { kAvx2, kAvx512Vnni, kAmx, kAmxTiles, kAmxEmulated };
std::string path_name(Path p) {
  switch (p) {
    case Path::kAvx2: return "avx2";
    case Path::kAvx512Vnni: return "avx512vnni";
    case Path::kAmx: return "amx";
    case Path::kAmxTiles: return "amx_tiles";
    case Path::kAmxEmulated: return "amx_emulated";
  }
  return "?";
}

// Runs `p` with the dispatcher forced onto it (the public int8_matmul entry, as the model calls it).
void run_path(Path p, const WeightMatrix& w, const float* x, int64_t T, float* y) {
  if (p == Path::kAmxEmulated || p == Path::kAmxTiles) {
    QuantizedActs a;
    quantize_activations(x, T, w.in, a);
    return p == Path::kAmxTiles ? int8_matmul_amx_tiles(w, a, y) : int8_matmul_amx_emulated(w, a, y);
  }
  const Isa isa = p == Path::kAvx2 ? Isa::kAvx2 : p == Path::kAvx512Vnni ? Isa::kAvx512Vnni : Isa::kAmx;
  set_isa_override(isa);
  EXPECT_EQ(active_isa(), isa);
  int8_matmul(w, x, T, y);
  set_isa_override(std::nullopt);
}

struct Case {
  WeightFormat f;
  int64_t G;
};

class Int8Paths : public ::testing::TestWithParam<std::tuple<Path, Case>> {
 protected:
  void SetUp() override {
    const Path p = std::get<0>(GetParam());
    const Isa isa = p == Path::kAvx2 ? Isa::kAvx2 : p == Path::kAvx512Vnni ? Isa::kAvx512Vnni : Isa::kAmx;  // kAmxTiles: AMX
    if (p != Path::kAmxEmulated && !isa_supported(isa))
      GTEST_SKIP() << path_name(p) << " path not run on this machine: " << isa_unsupported_reason(isa);
  }
};

// in: 32/64/96 (tail chunks only), 128, 160 and 416 (full chunks + tails), 544 and 1184 (MXFP4 on
// AVX-512 decodes 4 chunks' scales at once: one group + a tail; two groups + one lone chunk + a tail);
// out with row tails.
constexpr int64_t kIns[] = {32, 64, 96, 128, 160, 416, 544, 1184};

TEST_P(Int8Paths, ExactWithPowerOfTwoScales) {
  const auto [p, c] = GetParam();
  for (int64_t in : kIns) {
    if (in % c.G != 0) continue;
    const int64_t out = 37, T = 6;
    Mat m = random_matrix(c.f, out, in, c.G, /*exact=*/true, static_cast<uint32_t>(in));
    const auto x = random_x(T, in, 11);
    std::vector<float> y(static_cast<size_t>(T * out)), ref(y.size());
    int8_matmul(m.w, x.data(), T, ref.data(), Isa::kScalar);
    run_path(p, m.w, x.data(), T, y.data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], ref[i]) << "in " << in << " i " << i;
  }
}

TEST_P(Int8Paths, GeneralScalesWithinReassociationTolerance) {
  const auto [p, c] = GetParam();
  for (int64_t in : kIns) {
    if (in % c.G != 0) continue;
    const int64_t out = 21, T = 9;
    Mat m = random_matrix(c.f, out, in, c.G, /*exact=*/false, static_cast<uint32_t>(in + 1));
    const auto x = random_x(T, in, 12);
    std::vector<float> y(static_cast<size_t>(T * out)), ref(y.size()), wrow(static_cast<size_t>(in));
    int8_matmul(m.w, x.data(), T, ref.data(), Isa::kScalar);
    run_path(p, m.w, x.data(), T, y.data());
    QuantizedActs a;
    quantize_activations(x.data(), T, in, a);
    for (int64_t r = 0; r < out; ++r) {
      decode_row(m.w, r, wrow.data());
      for (int64_t t = 0; t < T; ++t) {
        double mag = 0;  // Σ|w·x| in the quantized domain
        for (int64_t k = 0; k < in; ++k)
          mag += std::fabs(static_cast<double>(wrow[static_cast<size_t>(k)]) * a.q[static_cast<size_t>(t * in + k)] * a.scale[static_cast<size_t>(t)]);
        const size_t i = static_cast<size_t>(t * out + r);
        ASSERT_NEAR(y[i], ref[i], 1e-5 * mag + 1e-30) << "in " << in << " row " << r << " token " << t;
      }
    }
    // Batch invariance: every prefix batch gives each token the same bits.
    for (int64_t n : {1, 4, 5}) {
      std::vector<float> part(static_cast<size_t>(n * out));
      run_path(p, m.w, x.data(), n, part.data());
      for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], y[i]) << "batch " << n << " i " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, Int8Paths,
    ::testing::Combine(::testing::Values(Path::kAvx2, Path::kAvx512Vnni, Path::kAmx, Path::kAmxTiles, Path::kAmxEmulated),
                       ::testing::Values(Case{WeightFormat::kW4A8, 32}, Case{WeightFormat::kW4A8, 64},
                                         Case{WeightFormat::kW4A8, 128}, Case{WeightFormat::kMxfp4, 32})),
    [](const auto& info) {
      const Case c = std::get<1>(info.param);
      return path_name(std::get<0>(info.param)) + "_" +
             (c.f == WeightFormat::kW4A8 ? "w4a8_g" + std::to_string(c.G) : std::string("mxfp4"));
    });

// On an AMX machine the dispatcher runs the AVX-512 VNNI kernels (small-T and GEMM form), not the tile kernel:
// a token's bits are the VNNI kernels' at every T, where the tile kernel's fp32 order would differ.
TEST(Int8Dispatch, AmxMachinesRunTheVnniKernels) {
  if (!isa_supported(Isa::kAmx)) GTEST_SKIP() << "AMX: " << isa_unsupported_reason(Isa::kAmx);
  size_t differ = 0;  // outputs where the tile kernel's bits differ from the VNNI kernels'
  // W4A8 with bf16 group scales (MXFP4's E8M0 scales are powers of two: both orders are exact there).
  for (const Case c : {Case{WeightFormat::kW4A8, 32}, Case{WeightFormat::kW4A8, 64}}) {
    const int64_t out = 40, in = 512;
    Mat m = random_matrix(c.f, out, in, c.G, /*exact=*/false, 21);
    for (int64_t T : {int64_t{1}, kInt8GemmMinTokens + 24}) {
      const auto x = random_x(T, in, 22);
      std::vector<float> vnni(static_cast<size_t>(T * out)), amx(vnni.size()), tiles(vnni.size());
      int8_matmul(m.w, x.data(), T, vnni.data(), Isa::kAvx512Vnni);
      int8_matmul(m.w, x.data(), T, amx.data(), Isa::kAmx);
      QuantizedActs a;
      quantize_activations(x.data(), T, in, a);
      int8_matmul_amx_tiles(m.w, a, tiles.data());
      for (size_t i = 0; i < vnni.size(); ++i) {
        ASSERT_EQ(amx[i], vnni[i]) << "T " << T << " i " << i;
        differ += tiles[i] != vnni[i];
      }
    }
  }
  EXPECT_GT(differ, 0u) << "the tile kernel's fp32 order should differ somewhere (else this test proves nothing)";
}

// E8M0 edge codes: 0 and 1 (subnormal scales), 254 and 255 (NaN) behave as in the scalar path, in
// every kind of chunk: inside a 4-chunk scale group, a lone chunk after the groups, the tail.
TEST(Int8Mxfp4, E8m0EdgeScales) {
  const int64_t out = 5, in = 1184, T = 2, nb = in / 32;  // 9 full chunks (2 groups + 1) + a 32-tail
  Mat m = random_matrix(WeightFormat::kMxfp4, out, in, 32, true, 3);
  m.scales[0] = 0;                // row 0, block 0
  m.scales[nb] = 255;             // row 1, block 0 → NaN
  m.scales[2 * nb + 36] = 0;      // row 2, tail block
  m.scales[2 * nb + 13] = 1;      // row 2, chunk 3 (group 0, last)
  m.scales[3 * nb + 21] = 0;      // row 3, chunk 5 (group 1)
  m.scales[3 * nb + 33] = 1;      // row 3, chunk 8 (lone chunk)
  m.scales[4 * nb + 30] = 254;    // row 4, chunk 7 (2^126)
  m.scales[4 * nb + 34] = 255;    // row 4, chunk 8 → NaN
  const auto x = random_x(T, in, 4);
  std::vector<float> ref(static_cast<size_t>(T * out)), y(ref.size());
  int8_matmul(m.w, x.data(), T, ref.data(), Isa::kScalar);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAmx}) {
    if (!isa_supported(isa)) continue;
    int8_matmul(m.w, x.data(), T, y.data(), isa);
    for (size_t i = 0; i < y.size(); ++i) {
      if (std::isnan(ref[i])) EXPECT_TRUE(std::isnan(y[i])) << isa_name(isa) << " " << i;
      else EXPECT_EQ(y[i], ref[i]) << isa_name(isa) << " " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3. Against fp32, and the hooks in linear.cpp
// ---------------------------------------------------------------------------------------------
double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double e = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - ref[i]) * double(a[i] - ref[i]), s += ref[i] * double(ref[i]);
  return e / s;
}

TEST(Int8Matmul, CloseToFp32ReferenceAndHookedIntoMatmul) {
  for (Case c : {Case{WeightFormat::kW4A8, 32}, Case{WeightFormat::kW4A8, 128}, Case{WeightFormat::kMxfp4, 32}}) {
    const int64_t out = 64, in = c.G == 128 ? 384 : 416, T = 5;
    Mat m = random_matrix(c.f, out, in, c.G, false, 9);
    const auto x = random_x(T, in, 10);
    std::vector<float> ref(static_cast<size_t>(T * out)), y(ref.size()), via(ref.size());
    matmul_reference(m.w, x.data(), T, ref.data());  // dequantized weights, fp32 x, fp64 sums
    int8_matmul(m.w, x.data(), T, y.data(), active_isa());
    const double e = nmse(y, ref);
    EXPECT_LT(e, 3e-4) << "format " << static_cast<int>(c.f);
    EXPECT_GT(e, 0.0);  // activations really were quantized
    set_mxfp4_int8(true);
    matmul(m.w, x.data(), T, via.data());
    set_mxfp4_int8(false);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(via[i], y[i]);
    if (c.f == WeightFormat::kMxfp4) {  // opt-in only: the default MXFP4 path stays fp32
      matmul(m.w, x.data(), T, via.data());
      EXPECT_LT(nmse(via, ref), 1e-10);
    }
  }
}

// matmul_many with an int8 task beside an fp32-path task, into a wider output (ldy > out): the int8
// columns equal a plain int8_matmul, the bf16 task's columns are untouched by it, the gap stays.
TEST(Int8Matmul, InsideMatmulManyWithStride) {
  const int64_t out = 24, in = 160, T = 6, ldy = 64;
  Mat q = random_matrix(WeightFormat::kW4A8, out, in, 32, false, 21);
  Mat b;
  b.packed.resize(static_cast<size_t>(out * in * 2));
  std::mt19937 rng(22);
  for (int64_t i = 0; i < out * in; ++i) {
    const uint16_t v = f32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    std::memcpy(b.packed.data() + 2 * i, &v, 2);
  }
  b.w.format = WeightFormat::kBF16, b.w.out = out, b.w.in = in, b.w.data = b.packed.data();
  const auto x = random_x(T, in, 23);
  std::vector<float> y(static_cast<size_t>(T * ldy), -7.0f), ref_q(static_cast<size_t>(T * out)), ref_b(ref_q.size());
  const MatmulTask tasks[2] = {{&q.w, x.data(), T, y.data(), ldy}, {&b.w, x.data(), T, y.data() + out, ldy}};
  matmul_many(std::span<const MatmulTask>(tasks, 2));
  int8_matmul(q.w, x.data(), T, ref_q.data());
  matmul(b.w, x.data(), T, ref_b.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < out; ++r) {
      ASSERT_EQ(y[static_cast<size_t>(t * ldy + r)], ref_q[static_cast<size_t>(t * out + r)]);
      ASSERT_EQ(y[static_cast<size_t>(t * ldy + out + r)], ref_b[static_cast<size_t>(t * out + r)]);
      if (2 * out + r < ldy) {
        ASSERT_EQ(y[static_cast<size_t>(t * ldy + 2 * out + r)], -7.0f);
      }
    }
}

TEST(Isa, NamesOverrideAndBest) {
  for (Isa i : kAllIsas) EXPECT_EQ(isa_from_name(isa_name(i)), i);
  EXPECT_FALSE(isa_from_name("sse9").has_value());
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  std::printf("best ISA on this machine: %s; AMX: %s\n", isa_name(best_isa()),
              isa_supported(Isa::kAmx) ? "yes" : isa_unsupported_reason(Isa::kAmx).c_str());
  set_isa_override(Isa::kScalar);
  EXPECT_EQ(active_isa(), Isa::kScalar);
  set_isa_override(std::nullopt);
  EXPECT_TRUE(isa_supported(active_isa()));
}

}  // namespace
}  // namespace kestrel::kernels
