// Grouped-query decode attention straight from the cached rows (kernels/cpu/gqa_decode.h): the AVX2 + FMA kernel
// against its scalar definition bit for bit (fp32 / bf16 / fp8 pages, rows across page edges, T = 1..16 queries,
// L around every 32-key block edge, 1..12 query heads per KV head, widths with and without a vector tail, 1 and 2
// threads); the definition against the tiled prefill kernel's (prefill_attention_reference) on the same keys and
// values, bit for bit; and the result against softmax attention in double precision. The same for the sliding
// window and the sinks, with a window of at least L equal to none and no row below a query's window read.
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gqa_decode.h"
#include "kernels/cpu/prefill_attention.h"

namespace kestrel {
namespace {

using kernels::GqaDecodeArgs;

// L cached rows [k (G·D) | v (G·D)] in pages of `page` tokens, stored in dtype; queries [T, H, D]. window and
// sinks (empty: none) go to the args.
struct Problem {
  int64_t T, L, H, G, D, page;
  int64_t window = 0;
  std::vector<float> sinks;
  kernels::KvRowFormat fmt;
  std::vector<float> q, rows;  // rows as fp32 [L, 2GD] (before storing)
  std::vector<std::vector<uint8_t>> pages;
  std::vector<const uint8_t*> ptrs;
  Problem(int64_t T_, int64_t L_, int64_t H_, int64_t G_, int64_t D_, KvCacheDtype dt, uint32_t seed, int64_t page_ = 16)
      : T(T_), L(L_), H(H_), G(G_), D(D_), page(page_) {
    fmt = {dt, 2 * G * D, 0};
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    q.resize(T * H * D), rows.resize(L * 2 * G * D);
    for (float& x : q) x = 2.0f * n(rng);  // scores spread over tens of units: real rescaling
    for (float& x : rows) x = n(rng);
    for (int64_t j = 0; j < L; ++j) {
      if (j % page == 0) pages.emplace_back(page * fmt.bytes(), 0xff);  // NaN-ish filler past the rows
      kernels::kv_store_row(fmt, rows.data() + j * 2 * G * D, pages.back().data() + (j % page) * fmt.bytes());
    }
    for (auto& p : pages) ptrs.push_back(p.data());
  }
  GqaDecodeArgs args(float* out) const {
    GqaDecodeArgs a;
    a.T = T, a.L = L, a.H = H, a.G = G, a.D = D, a.q = q.data(), a.pages = ptrs.data(), a.page_tokens = page, a.row = fmt;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.window = window, a.sinks = sinks.empty() ? nullptr : sinks.data();
    a.out = out;
    return a;
  }
};

// Sinks for H heads, three kinds by head: above every score (about +40, where scores stay within ±20: the sink
// rescales l and o), among the scores (in [−4, 4]) and far below them (about −200: weight 0).
std::vector<float> draw_sinks(int64_t H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> s(H);
  for (int64_t h = 0; h < H; ++h) {
    const float base[3] = {40.0f, 0.0f, -200.0f};
    s[h] = base[(h + seed) % 3] + u(rng);
  }
  return s;
}

constexpr int64_t kWindows[] = {0, 1, 5, 31, 32, 33, 100};

std::vector<float> run(const Problem& p, bool reference) {
  std::vector<float> out(p.T * p.H * p.D, std::numeric_limits<float>::quiet_NaN());
  const GqaDecodeArgs a = p.args(out.data());
  if (reference) kernels::gqa_decode_reference(a);
  else kernels::gqa_decode(std::span<const GqaDecodeArgs>(&a, 1));
  return out;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

TEST(GqaDecode, KernelEqualsItsDefinitionBitForBit) {
  struct Shape { int64_t T, L, H, G, D; };
  const Shape shapes[] = {{1, 1, 8, 1, 128}, {1, 31, 32, 4, 128}, {1, 32, 32, 4, 128}, {1, 33, 8, 2, 64},
                          {1, 300, 32, 4, 128}, {4, 97, 6, 3, 64}, {16, 160, 12, 1, 40}, {7, 7, 4, 4, 20},
                          {3, 64, 16, 2, 128}, {2, 129, 1, 1, 8}};
  for (KvCacheDtype dt : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFP8})
    for (const Shape& s : shapes)
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        const Problem p(s.T, s.L, s.H, s.G, s.D, dt, static_cast<uint32_t>(s.L * 31 + s.H));
        EXPECT_TRUE(same_bits(run(p, false), run(p, true)))
            << "T " << s.T << " L " << s.L << " H " << s.H << " G " << s.G << " D " << s.D << " dtype "
            << static_cast<int>(dt) << " threads " << threads;
      }
  omp_set_num_threads(2);
}

// With a sliding window and with sinks: every window of kWindows with and without sinks, fp32 and bf16 pages,
// queries whose windows start mid-block and mid-page, 1..12 query heads per KV head, 1 and 2 threads.
TEST(GqaDecode, WindowAndSinksKernelEqualsItsDefinitionBitForBit) {
  struct Shape { int64_t T, L, H, G, D; };
  const Shape shapes[] = {{1, 100, 32, 4, 128}, {4, 97, 6, 3, 64}, {16, 160, 12, 1, 40},
                          {3, 64, 16, 2, 128},  {2, 129, 1, 1, 8}, {7, 45, 24, 2, 20}};
  uint32_t seed = 41;
  for (KvCacheDtype dt : {KvCacheDtype::kF32, KvCacheDtype::kBF16})
    for (const Shape& s : shapes)
      for (int64_t window : kWindows)
        for (bool sinks : {false, true})
          for (int threads : {1, 2}) {
            omp_set_num_threads(threads);
            Problem p(s.T, s.L, s.H, s.G, s.D, dt, seed++);
            p.window = window;
            if (sinks) p.sinks = draw_sinks(s.H, seed);
            EXPECT_TRUE(same_bits(run(p, false), run(p, true)))
                << "T " << s.T << " L " << s.L << " H " << s.H << " G " << s.G << " D " << s.D << " dtype "
                << static_cast<int>(dt) << " window " << window << " sinks " << sinks << " threads " << threads;
          }
  omp_set_num_threads(2);
}

// A window of L keys or more: the bits of window 0, kernel and definition, with and without sinks.
TEST(GqaDecode, WindowOfAtLeastLEqualsNoWindow) {
  for (bool sinks : {false, true}) {
    Problem p(5, 77, 12, 3, 32, KvCacheDtype::kF32, 43);
    if (sinks) p.sinks = draw_sinks(p.H, 44);
    for (bool reference : {false, true}) {
      const auto full = run(p, reference);
      for (int64_t window : {p.L, p.L + 1, int64_t{1000}}) {
        p.window = window;
        EXPECT_TRUE(same_bits(run(p, reference), full)) << "window " << window << " sinks " << sinks;
        p.window = 0;
      }
    }
  }
}

// Rows below every query's window are never read: pages wholly below it removed (null) and the rows of the page
// it starts in filled with NaN leave the bits of kernel and definition alone.
TEST(GqaDecode, RowsBelowTheWindowAreNeverRead) {
  for (KvCacheDtype dt : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFP8}) {
    Problem p(3, 300, 8, 2, 64, dt, 45);
    p.window = 100;
    p.sinks = draw_sinks(p.H, 46);
    const auto kernel = run(p, false), reference = run(p, true);
    const int64_t lo = p.L - p.T - p.window + 1;  // the first query's first key: 198, inside page 12
    for (int64_t pg = 0; pg < lo / p.page; ++pg) p.ptrs[pg] = nullptr;
    std::memset(p.pages[lo / p.page].data(), 0xff, (lo % p.page) * p.fmt.bytes());
    EXPECT_TRUE(same_bits(run(p, false), kernel)) << "dtype " << static_cast<int>(dt);
    EXPECT_TRUE(same_bits(run(p, true), reference)) << "dtype " << static_cast<int>(dt);
  }
}

// Several sequences in one call: each equals its own call.
TEST(GqaDecode, BatchEqualsEachSequenceAlone) {
  const Problem a(1, 200, 32, 4, 128, KvCacheDtype::kF32, 1), b(3, 45, 32, 4, 128, KvCacheDtype::kF32, 2),
      c(1, 1, 32, 4, 128, KvCacheDtype::kF32, 3);
  std::vector<float> oa(a.T * 32 * 128), ob(b.T * 32 * 128), oc(c.T * 32 * 128);
  const GqaDecodeArgs args[] = {a.args(oa.data()), b.args(ob.data()), c.args(oc.data())};
  kernels::gqa_decode(args);
  EXPECT_TRUE(same_bits(oa, run(a, true)));
  EXPECT_TRUE(same_bits(ob, run(b, true)));
  EXPECT_TRUE(same_bits(oc, run(c, true)));
}

// The decode definition is the tiled prefill kernel's: the same queries, keys and values through
// prefill_attention_reference (each query head h reading KV head h / (H / G)) give the same bits, so a token's
// attention is the same in a prefill chunk and in a decode step; with every window of kWindows, with and without
// sinks, too.
TEST(GqaDecode, DefinitionIsThePrefillKernels) {
  for (auto [T, L, H, G, D] : {std::array<int64_t, 5>{1, 100, 8, 2, 64}, {5, 77, 12, 3, 32}, {16, 16, 4, 1, 128},
                               {9, 150, 8, 8, 40}}) {
    Problem p(T, L, H, G, D, KvCacheDtype::kF32, 7);
    const int64_t ks = kernels::packed_key_floats(L, D);
    std::vector<float> kt(G * ks, 0.0f), v(G * L * D);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < L; ++j) {
        const float* r = p.rows.data() + j * 2 * G * D;
        kernels::pack_key_part(kt.data() + g * ks, D, j, 0, r + g * D, D);
        std::memcpy(v.data() + (g * L + j) * D, r + G * D + g * D, D * 4);
      }
    for (int64_t window : kWindows)
      for (bool sinks : {false, true}) {
        p.window = window;
        p.sinks = sinks ? draw_sinks(H, static_cast<uint32_t>(L + window)) : std::vector<float>{};
        std::vector<float> want(T * H * D);
        kernels::PrefillAttentionArgs a;
        a.T = T, a.L = L, a.H = H, a.Dk = D, a.Dv = D, a.kv_group = H / G;
        a.q = p.q.data(), a.kt = kt.data(), a.kt_head_stride = ks, a.v = v.data(), a.v_head_stride = L * D;
        a.scale = 1.0f / std::sqrt(static_cast<float>(D));
        a.window = window, a.sinks = sinks ? p.sinks.data() : nullptr;
        a.out = want.data();
        kernels::prefill_attention_reference(a);
        EXPECT_TRUE(same_bits(run(p, true), want)) << "T " << T << " L " << L << " window " << window << " sinks " << sinks;
        EXPECT_TRUE(same_bits(run(p, false), want)) << "T " << T << " L " << L << " window " << window << " sinks " << sinks;
      }
  }
}

// Against softmax attention in double precision (the definition's rounding alone: ≤ 1e-5 relative).
TEST(GqaDecode, CloseToSoftmaxInDouble) {
  const int64_t T = 3, L = 500, H = 8, G = 2, D = 64;
  const Problem p(T, L, H, G, D, KvCacheDtype::kF32, 11);
  const auto got = run(p, false);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G), pos = L - T + t;
      std::vector<double> s(pos + 1);
      double mx = -1e300;
      for (int64_t j = 0; j <= pos; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += double(p.q[(t * H + h) * D + d]) * p.rows[j * 2 * G * D + g * D + d];
        s[j] = acc / std::sqrt(double(D));
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (double& x : s) l += (x = std::exp(x - mx));
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= pos; ++j) o += s[j] / l * p.rows[j * 2 * G * D + G * D + g * D + d];
        worst = std::max(worst, std::fabs(o - got[(t * H + h) * D + d]));
      }
    }
  EXPECT_LT(worst, 1e-5);
}

// With a window and sinks: softmax over the window's keys with exp(sink) in the denominator, in double precision;
// the kernel within 1e-5 of each output's scale (Σ w_j |v_j|, whatever the sink leaves of it).
TEST(GqaDecode, WindowAndSinksCloseToSoftmaxInDouble) {
  const int64_t T = 3, L = 300, H = 8, G = 2, D = 64;
  Problem p(T, L, H, G, D, KvCacheDtype::kF32, 47);
  p.sinks = draw_sinks(H, 48);
  double worst = 0;
  for (int64_t window : {1, 5, 33, 100}) {
    p.window = window;
    const auto got = run(p, false);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / G), pos = L - T + t, lo = std::max<int64_t>(0, pos - window + 1);
        std::vector<double> w(pos + 1 - lo);
        double mx = p.sinks[h];
        for (int64_t j = lo; j <= pos; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += double(p.q[(t * H + h) * D + d]) * p.rows[j * 2 * G * D + g * D + d];
          w[j - lo] = acc / std::sqrt(double(D)), mx = std::max(mx, w[j - lo]);
        }
        double l = std::exp(double(p.sinks[h]) - mx);
        for (double& x : w) l += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0, mag = 0;
          for (int64_t j = lo; j <= pos; ++j) {
            const double vj = p.rows[j * 2 * G * D + G * D + g * D + d];
            o += w[j - lo] / l * vj, mag += w[j - lo] / l * std::fabs(vj);
          }
          worst = std::max(worst, std::fabs(o - got[(t * H + h) * D + d]) / std::max(mag, 1e-30));
        }
      }
  }
  EXPECT_LT(worst, 1e-5);
}

}  // namespace
}  // namespace kestrel
