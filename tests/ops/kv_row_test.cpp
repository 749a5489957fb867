// The MLA latent cache row codec (kernels/cpu/kv_row.h) and the attention kernels reading paged rows in
// every cache dtype: byte layouts, bf16 round-to-nearest-even, e4m3 saturation and tile scales, the
// all-zero row, round-trip error bounds, and decode-on-load in the kernels giving exactly the result of
// the same kernels over the decoded rows stored as fp32.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/kv_row.h"

namespace kestrel {
namespace {

using kernels::KvRowFormat;

float scale_at(const uint8_t* row, int64_t lora, int64_t tile) {
  float s;
  std::memcpy(&s, row + lora + 4 * tile, 4);
  return s;
}

TEST(KvRow, LayoutBytes) {
  EXPECT_EQ(kv_row_bytes(KvCacheDtype::kF32, 512, 64), 2304);
  EXPECT_EQ(kv_row_bytes(KvCacheDtype::kBF16, 512, 64), 1152);
  EXPECT_EQ(kv_row_bytes(KvCacheDtype::kFP8, 512, 64), 656);  // FlashMLA's fp8_ds_mla row
  EXPECT_EQ(kv_row_bytes(KvCacheDtype::kFP8, 200, 16), 200 + 2 * 4 + 32);  // a partial last tile has its own scale
  for (KvCacheDtype d : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFP8})
    EXPECT_EQ(parse_kv_cache_dtype(kv_cache_dtype_name(d)), d);
  EXPECT_FALSE(parse_kv_cache_dtype("fp16"));
}

TEST(KvRow, Fp32IsTheFloatsAsTheyAre) {
  const KvRowFormat f{KvCacheDtype::kF32, 5, 3};
  const std::vector<float> x = {1.0f, -0.0f, 3.25e-30f, std::nextafter(1.0f, 2.0f), 7.0f, -1e30f, 0.1f, 2.0f};
  std::vector<uint8_t> row(static_cast<size_t>(f.bytes()));
  kernels::kv_store_row(f, x.data(), row.data());
  EXPECT_EQ(std::memcmp(row.data(), x.data(), row.size()), 0);
  std::vector<float> buf(8);
  EXPECT_EQ(kernels::kv_row_floats(f, row.data(), 8, buf.data()), reinterpret_cast<const float*>(row.data()))
      << "fp32 rows are read in place";
}

TEST(KvRow, Bf16RoundsToNearestEven) {
  const KvRowFormat f{KvCacheDtype::kBF16, 4, 2};
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (even: 1); 1 + 3·2^-8 halfway between 1 + 2^-7 and 1 + 2^-6
  // (even: 1 + 2^-6); just above a half rounds up; negative values mirror.
  const std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -(1.0f + 3 * 0x1p-8f),
                                0.0f, 65504.0f};
  const std::vector<float> want = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -(1.0f + 0x1p-6f), 0.0f, 65536.0f};
  std::vector<uint8_t> row(static_cast<size_t>(f.bytes()));
  kernels::kv_store_row(f, x.data(), row.data());
  std::vector<float> y(6);
  kernels::kv_load_row(f, row.data(), 6, y.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], want[i]) << i;
  uint16_t first;
  std::memcpy(&first, row.data(), 2);
  EXPECT_EQ(first, 0x3f80);  // the upper half of 1.0f's bits
}

TEST(KvRow, E4m3Saturates) {
  EXPECT_EQ(kernels::f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(kernels::f32_to_e4m3(1e6f), 0x7e);
  EXPECT_EQ(kernels::f32_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(kernels::f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(kernels::e4m3_table()[0x7e], 448.0f);
  // In a row the tile's largest magnitude maps onto ±448 (never past it) and decodes back to itself within
  // e4m3's relative half-step.
  const KvRowFormat f{KvCacheDtype::kFP8, 128, 0};
  std::vector<float> x(128, 0.5f);
  x[7] = -3000.0f;
  std::vector<uint8_t> row(static_cast<size_t>(f.bytes()));
  kernels::kv_store_row(f, x.data(), row.data());
  EXPECT_EQ(row[7], 0xfe);
  EXPECT_FLOAT_EQ(scale_at(row.data(), 128, 0), 3000.0f / 448.0f);
  std::vector<float> y(128);
  kernels::kv_load_row(f, row.data(), 128, y.data());
  EXPECT_NEAR(y[7], -3000.0f, 3000.0f * 1e-6f);
}

TEST(KvRow, AllZeroRowHasTheFloorScaleAndDecodesToZero) {
  const KvRowFormat f{KvCacheDtype::kFP8, 256, 64};
  const std::vector<float> x(320, 0.0f);
  std::vector<uint8_t> row(static_cast<size_t>(f.bytes()), 0xff);
  kernels::kv_store_row(f, x.data(), row.data());
  for (int64_t t = 0; t < 2; ++t) EXPECT_EQ(scale_at(row.data(), 256, t), 1e-4f * (1.0f / 448.0f)) << "amax floor 1e-4, as act_quant";
  for (int64_t i = 0; i < 256; ++i) EXPECT_EQ(row[static_cast<size_t>(i)], 0) << i;
  std::vector<float> y(320, 1.0f);
  kernels::kv_load_row(f, row.data(), 320, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// Every dtype: decoded = the format's value of the stored codes (fp8: table value × its tile's scale, rope
// bf16), each element within the format's rounding error; a prefix decode (n < lora + rope) matches.
TEST(KvRow, RoundTripWithinTheFormatsError) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t lora = 300, rope = 24;  // three tiles, the last partial
  std::vector<float> x(static_cast<size_t>(lora + rope));
  for (auto& v : x) v = nd(rng);
  x[200] = 40.0f;  // a tile with a large amax: small values there go subnormal
  for (KvCacheDtype d : {KvCacheDtype::kBF16, KvCacheDtype::kFP8}) {
    const KvRowFormat f{d, lora, rope};
    std::vector<uint8_t> row(static_cast<size_t>(f.bytes()));
    kernels::kv_store_row(f, x.data(), row.data());
    std::vector<float> y(x.size());
    kernels::kv_load_row(f, row.data(), lora + rope, y.data());
    for (int64_t i = 0; i < lora + rope; ++i) {
      const float xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
      if (d == KvCacheDtype::kBF16 || i >= lora) {
        EXPECT_LE(std::fabs(xi - yi), std::fabs(xi) * 0x1p-8f) << kv_cache_dtype_name(d) << " " << i;
        continue;
      }
      const float s = scale_at(row.data(), lora, i / kKvFp8Tile);
      EXPECT_EQ(yi, kernels::e4m3_table()[row[static_cast<size_t>(i)]] * s) << i;
      // e4m3: relative half-step 2^-4 on normals, absolute half-step 2^-10 · scale on subnormals.
      EXPECT_LE(std::fabs(xi - yi), std::max(std::fabs(xi) * 0x1p-4f, s * 0x1p-10f) * 1.0001f) << i;
    }
    std::vector<float> part(static_cast<size_t>(lora - 17));
    kernels::kv_load_row(f, row.data(), lora - 17, part.data());
    for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], y[i]) << "prefix decode " << i;
  }
}

// Random paged rows in dtype d, and the same rows decoded and stored as fp32 pages.
struct Paged {
  std::vector<std::vector<uint8_t>> mem, mem32;
  std::vector<const uint8_t*> pages, pages32;
};
Paged make_pages(KvCacheDtype d, int64_t L, int64_t page_tokens, int64_t lora, int64_t rope, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const KvRowFormat f{d, lora, rope}, f32{KvCacheDtype::kF32, lora, rope};
  Paged p;
  std::vector<float> x(static_cast<size_t>(lora + rope)), y(x.size());
  for (int64_t j = 0; j < L; ++j) {
    if (j % page_tokens == 0) {
      p.mem.emplace_back(static_cast<size_t>(page_tokens * f.bytes()));
      p.mem32.emplace_back(static_cast<size_t>(page_tokens * f32.bytes()));
    }
    for (auto& v : x) v = nd(rng);
    uint8_t* r = p.mem.back().data() + (j % page_tokens) * f.bytes();
    kernels::kv_store_row(f, x.data(), r);
    kernels::kv_load_row(f, r, lora + rope, y.data());
    kernels::kv_store_row(f32, y.data(), p.mem32.back().data() + (j % page_tokens) * f32.bytes());
  }
  for (size_t i = 0; i < p.mem.size(); ++i) p.pages.push_back(p.mem[i].data()), p.pages32.push_back(p.mem32[i].data());
  return p;
}

// The head grouping of decoded rows depends on the thread count: the kernels run under several.
struct ThreadCount {
  explicit ThreadCount(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
  int saved;
};

class KvRowKernels : public ::testing::TestWithParam<KvCacheDtype> {};

TEST_P(KvRowKernels, CausalAttentionDecodesOnLoadExactly) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int64_t T = 3, L = 45, H = 4, lora = 160, rope = 32, page_tokens = 8;
  const Paged p = make_pages(GetParam(), L, page_tokens, lora, rope, rng);
  std::vector<float> q(static_cast<size_t>(T * H * (lora + rope)));
  for (auto& v : q) v = nd(rng);
  std::vector<float> out(static_cast<size_t>(T * H * lora)), ref(out.size());
  kernels::AttentionArgs a;
  a.T = T, a.L = L, a.H = H, a.Dk = lora + rope, a.Dv = lora, a.q = q.data(), a.scale = 0.07f;
  a.page_tokens = page_tokens;
  a.pages = p.pages32.data(), a.row = {KvCacheDtype::kF32, lora, rope}, a.out = ref.data();
  kernels::causal_attention(a);
  for (int threads : {1, 5, 12}) {  // head groups of 4, 3 (one partial) and 1
    ThreadCount tc(threads);
    std::fill(out.begin(), out.end(), -1.0f);
    a.pages = p.pages.data(), a.row = {GetParam(), lora, rope}, a.out = out.data();
    kernels::causal_attention(a);
    EXPECT_EQ(out, ref) << threads << " threads";
  }
}

// Several attentions in one region (the decode segments of a batch), one in this dtype and one over fp32
// pages, equal the calls one by one: the head grouping of decoded rows changes no bit.
TEST_P(KvRowKernels, ManyEqualsOneByOne) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const int64_t lora = 96, rope = 32, page_tokens = 4, H = 16;
  const Paged p = make_pages(GetParam(), 30, page_tokens, lora, rope, rng);
  std::vector<float> q(static_cast<size_t>(2 * H * (lora + rope)));
  for (auto& v : q) v = nd(rng);
  std::vector<float> out(static_cast<size_t>(3 * H * lora)), ref(out.size());
  std::vector<kernels::AttentionArgs> args(2);
  for (size_t i = 0; i < 2; ++i) {
    kernels::AttentionArgs& a = args[i];
    a.T = i == 0 ? 1 : 2, a.L = i == 0 ? 30 : 21, a.H = H, a.Dk = lora + rope, a.Dv = lora, a.scale = 0.05f;
    a.page_tokens = page_tokens;
    a.pages = i == 0 ? p.pages.data() : p.pages32.data();
    a.row = {i == 0 ? GetParam() : KvCacheDtype::kF32, lora, rope};
  }
  args[0].q = q.data(), args[1].q = q.data();  // both read the first queries
  args[0].out = out.data(), args[1].out = out.data() + H * lora;
  kernels::causal_attention_many(args);
  for (kernels::AttentionArgs& a : args) a.out = ref.data() + (a.out - out.data());
  for (const kernels::AttentionArgs& a : args) kernels::causal_attention(a);
  EXPECT_EQ(out, ref);
}

TEST_P(KvRowKernels, SparseMlaDecodesOnLoadExactly) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const int64_t T = 2, L = 40, H = 11, lora = 128, rope = 16, page_tokens = 16, K = 6;
  const Paged p = make_pages(GetParam(), L, page_tokens, lora, rope, rng);
  std::vector<float> q(static_cast<size_t>(T * H * (lora + rope)));
  for (auto& v : q) v = nd(rng);
  const std::vector<int32_t> idx = {0, 5, 17, 33, 39, -1, 2, 3, 20, 21, 38, 39};
  std::vector<float> out(static_cast<size_t>(T * H * lora)), ref(out.size());
  kernels::SparseMlaArgs a;
  a.T = T, a.H = H, a.Dk = lora + rope, a.Dv = lora, a.topk = K, a.q = q.data(), a.idx = idx.data(), a.scale = 0.1f;
  a.page_tokens = page_tokens;
  a.pages = p.pages32.data(), a.row = {KvCacheDtype::kF32, lora, rope}, a.out = ref.data();
  kernels::sparse_mla_attention(a);
  for (int threads : {1, 2, 3}) {  // head groups of 8 (one partial), 5 (one partial) and 3 (one partial)
    ThreadCount tc(threads);
    std::fill(out.begin(), out.end(), -1.0f);
    a.pages = p.pages.data(), a.row = {GetParam(), lora, rope}, a.out = out.data();
    kernels::sparse_mla_attention(a);
    EXPECT_EQ(out, ref) << threads << " threads";
  }
}

// A range of a row's latent part decodes to exactly what the whole row's decode holds at those positions, for
// ranges inside one fp8 tile, across tile edges and up to the end of the latent part.
TEST(KvRow, RangeDecodeEqualsTheRowsDecodeThere) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (KvCacheDtype dt : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFP8}) {
    const KvRowFormat f{dt, 1024, 0};
    std::vector<float> x(1024), whole(1024);
    for (float& v : x) v = n(rng);
    std::vector<uint8_t> row(f.bytes());
    kernels::kv_store_row(f, x.data(), row.data());
    kernels::kv_load_row(f, row.data(), 1024, whole.data());
    for (auto [b, len] : {std::pair<int64_t, int64_t>{0, 128}, {128, 128}, {384, 128}, {100, 60}, {120, 300}, {896, 128},
                          {1000, 24}, {5, 1}}) {
      std::vector<float> part(static_cast<size_t>(len), -1.0f);
      kernels::kv_load_range(f, row.data(), b, len, part.data());
      EXPECT_EQ(std::memcmp(part.data(), whole.data() + b, static_cast<size_t>(len) * 4), 0)
          << kv_cache_dtype_name(dt) << " [" << b << ", " << b + len << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvRowKernels, ::testing::Values(KvCacheDtype::kBF16, KvCacheDtype::kFP8),
                         [](const auto& i) { return std::string(kv_cache_dtype_name(i.param)); });

}  // namespace
}  // namespace kestrel
