// The vision tower's key-tiled attention (kernels/cpu/flash_attention.h):
// - attend_rows equals softmax(scale · q Kᵀ) V computed in fp64 on the same fp32 inputs within 2e-6 · max |v|
//   (fp32 sums over ≤ 2,000 keys of weights in [0, 1]), across the tile edges: key counts below
//   one panel, between panels, over one and several 512-key tiles, head widths that are and are not a multiple of
//   16, query blocks that end inside a 12-row / 6-row micro-kernel group; with a large score spread the online
//   softmax's rescaling (a later tile holding the row's maximum) is exercised;
// - a row's output has the same bits whatever block of rows it is computed in (alone, first, last, in blocks of
//   1 to 100 rows): what makes an image's rows independent of the batch in the tower;
// - the same bits run to run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/flash_attention.h"

namespace kestrel::kernels {
namespace {

struct Head {
  int64_t n, hd, ld;
  std::vector<float> qkv;     // n rows of [q | k | v], each hd wide, row stride ld
  std::vector<float> packed;  // pack_keys_values's output plus alignment slack
  float* aligned = nullptr;
};

Head make_head(int64_t n, int64_t hd, float spread, uint32_t seed) {
  Head h{n, hd, 3 * hd + 5, {}, {}, nullptr};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  h.qkv.resize(static_cast<size_t>(n * h.ld));
  for (float& x : h.qkv) x = u(rng);
  h.packed.resize(static_cast<size_t>(packed_kv_floats(n, hd) + 16));
  h.aligned = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(h.packed.data()) + 63) & ~uintptr_t{63});
  pack_keys_values(h.qkv.data() + hd, h.qkv.data() + 2 * hd, h.ld, n, hd, h.aligned);
  return h;
}

// Rows [i0, i0 + B) of the head's attention output, [B][hd].
std::vector<float> attend(const Head& h, int64_t i0, int64_t B, float scale) {
  std::vector<float> out(static_cast<size_t>(B * h.hd), NAN);
  attend_rows(h.qkv.data() + i0 * h.ld, h.ld, B, h.aligned, h.n, h.hd, scale, out.data(), h.hd);
  return out;
}

std::vector<double> reference_row(const Head& h, int64_t i, float scale) {
  const float* q = h.qkv.data() + i * h.ld;
  std::vector<double> s(static_cast<size_t>(h.n)), out(static_cast<size_t>(h.hd), 0.0);
  double top = -INFINITY, total = 0;
  for (int64_t j = 0; j < h.n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < h.hd; ++d) dot += double{q[d]} * h.qkv[static_cast<size_t>(j * h.ld + h.hd + d)];
    s[static_cast<size_t>(j)] = dot * scale;
    top = std::max(top, s[static_cast<size_t>(j)]);
  }
  for (int64_t j = 0; j < h.n; ++j) {
    const double e = std::exp(s[static_cast<size_t>(j)] - top);
    total += e;
    for (int64_t d = 0; d < h.hd; ++d) out[static_cast<size_t>(d)] += e * h.qkv[static_cast<size_t>(j * h.ld + 2 * h.hd + d)];
  }
  for (double& x : out) x /= total;
  return out;
}

TEST(FlashAttention, MatchesFp64SoftmaxAttentionAcrossTileEdges) {
  struct Case {
    int64_t n, hd;
    float spread;
  };
  for (const Case c : {Case{1, 16, 1}, Case{7, 20, 1}, Case{32, 128, 1}, Case{45, 36, 1}, Case{511, 128, 1},
                       Case{512, 64, 1}, Case{700, 128, 3}, Case{1100, 72, 3}, Case{2000, 128, 2}}) {
    const Head h = make_head(c.n, c.hd, c.spread, static_cast<uint32_t>(c.n * 131 + c.hd));
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    const int64_t B = std::min<int64_t>(c.n, 29);
    for (int64_t i0 : {int64_t{0}, c.n - B}) {
      const std::vector<float> got = attend(h, i0, B, scale);
      double worst = 0;
      for (int64_t i = 0; i < B; ++i) {
        const std::vector<double> want = reference_row(h, i0 + i, scale);
        for (int64_t d = 0; d < c.hd; ++d)
          worst = std::max(worst, std::abs(got[static_cast<size_t>(i * c.hd + d)] - want[static_cast<size_t>(d)]));
      }
      EXPECT_LE(worst, 2e-6 * c.spread) << "n " << c.n << " hd " << c.hd << " rows from " << i0;
    }
  }
}

TEST(FlashAttention, LaterTileHoldingTheMaximumRescalesEarlierOnes) {
  // Every query scores far higher against the last key than against any other, so the max rises at the last tile.
  Head h = make_head(1030, 32, 1, 7);
  for (int64_t d = 0; d < h.hd; ++d) {
    h.qkv[static_cast<size_t>(1029 * h.ld + h.hd + d)] = 4.0f;  // the last key
    for (int64_t i = 0; i < h.n; ++i) h.qkv[static_cast<size_t>(i * h.ld + d)] = std::abs(h.qkv[static_cast<size_t>(i * h.ld + d)]);
  }
  pack_keys_values(h.qkv.data() + h.hd, h.qkv.data() + 2 * h.hd, h.ld, h.n, h.hd, h.aligned);
  const float scale = 0.25f;
  const std::vector<float> got = attend(h, 0, 13, scale);
  for (int64_t i = 0; i < 13; ++i) {
    const std::vector<double> want = reference_row(h, i, scale);
    for (int64_t d = 0; d < h.hd; ++d) EXPECT_NEAR(got[static_cast<size_t>(i * h.hd + d)], want[static_cast<size_t>(d)], 2e-6);
  }
}

TEST(FlashAttention, RowBitsDoNotDependOnTheBlockAroundThem) {
  const Head h = make_head(1100, 128, 1, 11);
  const float scale = 1.0f / std::sqrt(128.0f);
  const std::vector<float> block = attend(h, 0, 100, scale);
  for (int64_t B : {1, 5, 6, 12, 13, 37, 96}) {
    for (int64_t i0 = 0; i0 + B <= 100; i0 += B) {
      const std::vector<float> part = attend(h, i0, B, scale);
      for (int64_t k = 0; k < B * h.hd; ++k)
        ASSERT_EQ(part[static_cast<size_t>(k)], block[static_cast<size_t>(i0 * h.hd + k)]) << "block " << B << " at " << i0;
    }
  }
  EXPECT_EQ(attend(h, 0, 100, scale), block);  // run to run
}

}  // namespace
}  // namespace kestrel::kernels
