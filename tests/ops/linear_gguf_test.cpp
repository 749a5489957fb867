// GGUF block formats (Q8_0, Q4_0, MXFP4 as ggml packs them): the row decoders reproduce gguf-py's own
// gguf.quants.dequantize bit for bit on random blocks (tests/data/ops/gguf_blocks.safetensors, written by
// tools/gen_gguf_goldens.py; every decoded value is exact in fp32, so equality is the right check), and
// matmul over GGUF matrices gives each token the same bits at every batch size and agrees with the
// fp64 scalar reference (relative 1e-5: fp32 accumulation over 96 terms).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/linear_gguf.h"
#include "loader/safetensors.h"

namespace kestrel::kernels {
namespace {

struct Blocks {
  std::vector<uint8_t> raw;
  std::vector<float> values;
};

Blocks read_blocks(const std::string& fmt) {
  auto f = SafetensorsFile::open(std::string(KESTREL_TEST_DATA) + "/ops/gguf_blocks.safetensors");
  if (!f) throw std::runtime_error(f.error().message());
  Blocks b;
  for (const auto& e : f->header().entries) {
    const TensorView v = f->view(e);
    if (e.name == fmt + "_blocks") b.raw.assign(v.as<uint8_t>(), v.as<uint8_t>() + v.numel());
    if (e.name == fmt + "_values") b.values = to_f32(v);
  }
  return b;
}

struct DecodeCase {
  const char* fmt;
  WeightFormat format;
};

class GgufDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(GgufDecode, MatchesGgufPyDequantize) {
  const auto& c = GetParam();
  const Blocks b = read_blocks(c.fmt);
  const int64_t bb = gguf_block_bytes(c.format);
  ASSERT_GT(b.raw.size(), 0u);
  ASSERT_EQ(static_cast<int64_t>(b.raw.size()) % bb, 0);
  const int64_t n_blocks = static_cast<int64_t>(b.raw.size()) / bb;
  ASSERT_EQ(b.values.size(), static_cast<size_t>(n_blocks * 32));
  // As one matrix of 4 rows (decode_row path) — covers the row offset arithmetic too.
  ASSERT_EQ(n_blocks % 4, 0);
  WeightMatrix w;
  w.format = c.format, w.out = 4, w.in = n_blocks / 4 * 32, w.data = b.raw.data();
  std::vector<float> row(static_cast<size_t>(w.in));
  for (int64_t r = 0; r < w.out; ++r) {
    decode_row(w, r, row.data());
    for (int64_t i = 0; i < w.in; ++i) {
      const float want = b.values[static_cast<size_t>(r * w.in + i)];
      ASSERT_EQ(row[static_cast<size_t>(i)], want) << c.fmt << " row " << r << " element " << i << ": " << row[static_cast<size_t>(i)] << " vs " << want;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GgufDecode,
                         ::testing::Values(DecodeCase{"q8_0", WeightFormat::kGgufQ8_0},
                                           DecodeCase{"q4_0", WeightFormat::kGgufQ4_0},
                                           DecodeCase{"mxfp4", WeightFormat::kGgufMxfp4}),
                         [](const auto& info) { return std::string(info.param.fmt); });

class GgufMatmul : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(GgufMatmul, PerTokenBitsIndependentOfBatchAndMatchReference) {
  set_gguf_int8(false);  // the exact path (fp32 activations); the int8 mode is tested in gguf_int8_test
  const int64_t out = 37, in = 96, T = 9;
  const int64_t bb = gguf_block_bytes(GetParam());
  std::mt19937 rng(11);
  std::vector<uint8_t> data(static_cast<size_t>(out * in / 32 * bb));
  for (auto& v : data) v = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < out * in / 32; ++blk) {  // sane scales: fp16 d in ±[1e-3, 1); E8M0 near 2^0
    uint8_t* p = data.data() + blk * bb;
    if (GetParam() == WeightFormat::kGgufMxfp4) {
      p[0] = static_cast<uint8_t>(120 + rng() % 8);
    } else {
      const uint16_t h = static_cast<uint16_t>((rng() & 0x8000u) | ((5 + rng() % 9) << 10) | (rng() & 0x3ffu));
      std::memcpy(p, &h, 2);
    }
  }
  WeightMatrix w;
  w.format = GetParam(), w.out = out, w.in = in, w.data = data.data();
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> x(static_cast<size_t>(T * in));
  for (auto& v : x) v = d(rng);
  std::vector<float> full(static_cast<size_t>(T * out)), ref(static_cast<size_t>(T * out));
  matmul(w, x.data(), T, full.data());
  matmul_reference(w, x.data(), T, ref.data());
  for (int64_t n = 1; n <= T; ++n) {
    std::vector<float> part(static_cast<size_t>(n * out));
    matmul(w, x.data(), n, part.data());
    for (int64_t i = 0; i < n * out; ++i) ASSERT_EQ(part[static_cast<size_t>(i)], full[static_cast<size_t>(i)]) << "n " << n;
  }
  for (int64_t i = 0; i < T * out; ++i)
    EXPECT_NEAR(full[static_cast<size_t>(i)], ref[static_cast<size_t>(i)], 1e-5 * (std::fabs(ref[static_cast<size_t>(i)]) + 1.0));
  set_gguf_int8(true);
}

INSTANTIATE_TEST_SUITE_P(Formats, GgufMatmul,
                         ::testing::Values(WeightFormat::kGgufQ8_0, WeightFormat::kGgufQ4_0, WeightFormat::kGgufMxfp4));

}  // namespace
}  // namespace kestrel::kernels
