// The tiled prefill attention (kernels/cpu/prefill_attention.h): its exp against libm, the kernel against its
// scalar definition bit for bit (shapes around every tile edge, 1 and 2 threads; the CPU's own path and the
// AVX2 + FMA path forced), a query's bits independent of the chunk it arrives in, nothing past a query's position read, and the result against softmax attention in
// double precision; grouped-query attention (kv_group) against copied key/value heads and the definition; the
// sliding window and the sinks the same ways (bits against the definition on every path, in every chunking, a
// window of at least L equal to none, nothing below a query's window used, the definition against softmax over
// the window with the sink in its denominator in double precision).
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/prefill_attention.h"

namespace kestrel {
namespace {

using kernels::PrefillAttentionArgs;

// Queries [T, H, Dk], keys [L, H, Dk], values [L, H, Dv]; packed copies for the kernel. Packed keys past L and
// values are filled with NaN where the kernel must not look. group, window and sinks (empty: none) go to the args.
struct Problem {
  int64_t T, L, H, Dk, Dv;
  std::vector<float> q, k, v, kt, vh;
  int64_t group = 1, window = 0;
  std::vector<float> sinks;
  Problem(int64_t T_, int64_t L_, int64_t H_, int64_t Dk_, int64_t Dv_, uint32_t seed) : T(T_), L(L_), H(H_), Dk(Dk_), Dv(Dv_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    q.resize(T * H * Dk), k.resize(L * H * Dk), v.resize(L * H * Dv);
    for (float& x : q) x = 2.0f * n(rng);  // scores spread over tens of units: real rescaling of o
    for (float& x : k) x = n(rng);
    for (float& x : v) x = n(rng);
    const int64_t ks = kernels::packed_key_floats(L, Dk);
    kt.assign(H * ks, std::numeric_limits<float>::quiet_NaN());
    vh.resize(H * L * Dv);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < L; ++j) {
        kernels::pack_key_part(kt.data() + h * ks, Dk, j, 0, k.data() + (j * H + h) * Dk, Dk);
        std::memcpy(vh.data() + (h * L + j) * Dv, v.data() + (j * H + h) * Dv, Dv * 4);
      }
  }
  // Queries [t0, t1) of the full problem as a chunk of their own: keys up to the last of them.
  PrefillAttentionArgs args(float* out, int64_t t0 = 0, int64_t t1 = -1) const {
    if (t1 < 0) t1 = T;
    PrefillAttentionArgs a;
    a.T = t1 - t0, a.L = L - T + t1, a.H = H, a.Dk = Dk, a.Dv = Dv;
    a.q = q.data() + t0 * H * Dk;
    a.kt = kt.data(), a.kt_head_stride = kernels::packed_key_floats(L, Dk);
    a.v = vh.data(), a.v_head_stride = L * Dv;
    a.scale = 1.0f / std::sqrt(static_cast<float>(Dk));
    a.kv_group = group, a.window = window, a.sinks = sinks.empty() ? nullptr : sinks.data();
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

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(PrefillAttention, ExpWithinTwoUlpOfLibm) {
  int64_t worst = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.00173f) {
    const float got = kernels::prefill_exp(x), want = static_cast<float>(std::exp(static_cast<double>(x)));
    worst = std::max<int64_t>(worst, std::abs(std::bit_cast<int32_t>(got) - std::bit_cast<int32_t>(want)));
  }
  EXPECT_LE(worst, 2);
  EXPECT_EQ(kernels::prefill_exp(0.0f), 1.0f);
  EXPECT_EQ(kernels::prefill_exp(-INFINITY), 0.0f);
  EXPECT_EQ(kernels::prefill_exp(-87.5f), 0.0f);
}

using Kernel = void (*)(const PrefillAttentionArgs&);

// `kernel` equals the scalar definition bit for bit over shapes at every tile and block edge (T around 4 and 64,
// contexts around the 32-key blocks, Dk and Dv off the vector widths), on 1 and 2 threads.
void expect_definition_bits(Kernel kernel) {
  struct Shape { int64_t T, ctx, H, Dk, Dv; };
  const Shape shapes[] = {{1, 0, 1, 8, 16},    {3, 5, 2, 24, 20},   {17, 0, 3, 40, 16},  {31, 33, 2, 24, 8},
                          {64, 0, 1, 192, 128}, {65, 31, 2, 192, 128}, {70, 32, 3, 56, 72}, {200, 100, 2, 24, 130},
                          {5, 64, 4, 16, 64},   {129, 1, 1, 17, 3},    {6, 15, 2, 9, 23},   {36, 60, 1, 192, 136},
                          {45, 70, 2, 16, 200}};
  uint32_t seed = 1;
  for (const Shape& s : shapes)
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const Problem p(s.T, s.T + s.ctx, s.H, s.Dk, s.Dv, seed++);
      std::vector<float> got(s.T * s.H * s.Dv, -1.0f), want(got.size(), -2.0f);
      kernel(p.args(got.data()));
      kernels::prefill_attention_reference(p.args(want.data()));
      EXPECT_TRUE(same_bits(got, want)) << "T " << s.T << " ctx " << s.ctx << " H " << s.H << " Dk " << s.Dk << " Dv " << s.Dv
                                        << " threads " << threads;
      for (float x : got) ASSERT_TRUE(std::isfinite(x));
    }
  omp_set_num_threads(omp_get_num_procs());
}

// A query gives the same bits whether it arrives in one chunk of 300 or in chunks of 1, 17, 64 or 100 (with a
// window, chunks that start inside it; with sinks).
void expect_same_bits_in_every_chunking(Kernel kernel, int64_t window = 0, bool sinks = false) {
  Problem p(300, 340, 2, 48, 32, 7);
  p.window = window;
  if (sinks) p.sinks = draw_sinks(p.H, 8);
  std::vector<float> whole(p.T * p.H * p.Dv);
  kernel(p.args(whole.data()));
  for (int64_t chunk : {1, 17, 64, 100}) {
    std::vector<float> pieces(whole.size());
    for (int64_t t0 = 0; t0 < p.T; t0 += chunk) {
      const int64_t t1 = std::min(p.T, t0 + chunk);
      kernel(p.args(pieces.data() + t0 * p.H * p.Dv, t0, t1));
    }
    EXPECT_TRUE(same_bits(whole, pieces)) << "chunk " << chunk << " window " << window << " sinks " << sinks;
  }
}

// With a sliding window and with sinks, `kernel` equals the scalar definition bit for bit: every window of
// kWindows (around the 32-key block edges) with and without sinks, chunks whose first query sits inside a
// window (ctx off the block edges), tiles whose queries start their windows in different blocks, GQA groups 1,
// 2, 4 and 8, on 1 and 2 threads.
void expect_window_and_sink_bits(Kernel kernel) {
  struct Shape { int64_t T, ctx, H, Dk, Dv, group; };
  const Shape shapes[] = {{3, 45, 2, 24, 20, 1},   {17, 70, 4, 40, 16, 2},  {70, 33, 3, 56, 72, 1},
                          {65, 100, 4, 16, 64, 4}, {130, 7, 2, 24, 130, 2}, {40, 200, 8, 17, 3, 8}};
  uint32_t seed = 31;
  for (const Shape& s : shapes)
    for (int64_t window : kWindows)
      for (bool sinks : {false, true})
        for (int threads : {1, 2}) {
          omp_set_num_threads(threads);
          Problem p(s.T, s.T + s.ctx, s.H, s.Dk, s.Dv, seed++);
          p.group = s.group, p.window = window;
          if (sinks) p.sinks = draw_sinks(s.H, seed);
          std::vector<float> got(s.T * s.H * s.Dv, -1.0f), want(got.size(), -2.0f);
          kernel(p.args(got.data()));
          kernels::prefill_attention_reference(p.args(want.data()));
          EXPECT_TRUE(same_bits(got, want)) << "T " << s.T << " ctx " << s.ctx << " H " << s.H << " group " << s.group
                                            << " window " << window << " sinks " << sinks << " threads " << threads;
          for (float x : got) ASSERT_TRUE(std::isfinite(x));
        }
  omp_set_num_threads(omp_get_num_procs());
}

// The path the CPU takes (AVX-512, else AVX2 + FMA, else the definition itself).
TEST(PrefillAttention, KernelEqualsItsDefinitionBitForBit) { expect_definition_bits(kernels::prefill_attention); }

TEST(PrefillAttention, AQueryHasTheSameBitsInEveryChunking) { expect_same_bits_in_every_chunking(kernels::prefill_attention); }

// The AVX2 + FMA work item, forced (on AVX-512 CPUs too).
TEST(PrefillAttention, Avx2KernelEqualsItsDefinitionBitForBit) {
  if (!kernels::prefill_attention_avx2_supported()) GTEST_SKIP() << "AVX2 path: this CPU lacks AVX2 or FMA";
  expect_definition_bits(kernels::prefill_attention_avx2);
}

TEST(PrefillAttention, Avx2AQueryHasTheSameBitsInEveryChunking) {
  if (!kernels::prefill_attention_avx2_supported()) GTEST_SKIP() << "AVX2 path: this CPU lacks AVX2 or FMA";
  expect_same_bits_in_every_chunking(kernels::prefill_attention_avx2);
}

TEST(PrefillAttention, WindowAndSinksEqualTheirDefinitionBitForBit) {
  expect_window_and_sink_bits(kernels::prefill_attention);
}

TEST(PrefillAttention, Avx2WindowAndSinksEqualTheirDefinitionBitForBit) {
  if (!kernels::prefill_attention_avx2_supported()) GTEST_SKIP() << "AVX2 path: this CPU lacks AVX2 or FMA";
  expect_window_and_sink_bits(kernels::prefill_attention_avx2);
}

TEST(PrefillAttention, WindowAndSinksSameBitsInEveryChunking) {
  for (int64_t window : {1, 33, 100}) expect_same_bits_in_every_chunking(kernels::prefill_attention, window, true);
}

TEST(PrefillAttention, Avx2WindowAndSinksSameBitsInEveryChunking) {
  if (!kernels::prefill_attention_avx2_supported()) GTEST_SKIP() << "AVX2 path: this CPU lacks AVX2 or FMA";
  for (int64_t window : {1, 33, 100}) expect_same_bits_in_every_chunking(kernels::prefill_attention_avx2, window, true);
}

// Every path, the definition included.
std::vector<Kernel> every_path() {
  std::vector<Kernel> k = {kernels::prefill_attention, kernels::prefill_attention_reference};
  if (kernels::prefill_attention_avx2_supported()) k.push_back(kernels::prefill_attention_avx2);
  return k;
}

// A window of L keys or more leaves every query all its keys: the bits of window 0, on every path, with and
// without sinks.
TEST(PrefillAttention, WindowOfAtLeastLEqualsNoWindow) {
  for (bool sinks : {false, true}) {
    Problem p(70, 100, 4, 24, 16, 13);
    p.group = 2;
    if (sinks) p.sinks = draw_sinks(p.H, 14);
    for (Kernel kernel : every_path()) {
      std::vector<float> full(p.T * p.H * p.Dv);
      p.window = 0;
      kernel(p.args(full.data()));
      for (int64_t window : {p.L, p.L + 1, int64_t{1000}}) {
        std::vector<float> got(full.size());
        p.window = window;
        kernel(p.args(got.data()));
        EXPECT_TRUE(same_bits(got, full)) << "window " << window << " sinks " << sinks;
      }
    }
  }
}

// Keys and values below a query's window never reach it: with those of positions below 90 (mid-block) NaN, the
// queries whose window starts at 90 or later keep their bits, on every path.
TEST(PrefillAttention, KeysBelowTheWindowNeverReachAQuery) {
  Problem p(80, 150, 2, 24, 16, 17);
  p.window = 40;
  p.sinks = draw_sinks(p.H, 18);
  const int64_t cut = 90, first = cut + p.window - 1 - (p.L - p.T);  // first query whose window starts at cut
  std::vector<std::vector<float>> before;
  for (Kernel kernel : every_path()) {
    before.emplace_back(p.T * p.H * p.Dv);
    kernel(p.args(before.back().data()));
  }
  const int64_t ks = kernels::packed_key_floats(p.L, p.Dk);
  const std::vector<float> nan(p.Dk, std::numeric_limits<float>::quiet_NaN());
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t j = 0; j < cut; ++j) {
      kernels::pack_key_part(p.kt.data() + h * ks, p.Dk, j, 0, nan.data(), p.Dk);
      std::fill_n(p.vh.data() + (h * p.L + j) * p.Dv, p.Dv, std::numeric_limits<float>::quiet_NaN());
    }
  const size_t from = first * p.H * p.Dv;
  for (size_t k = 0; k < before.size(); ++k) {
    std::vector<float> after(before[k].size());
    every_path()[k](p.args(after.data()));
    EXPECT_EQ(std::memcmp(before[k].data() + from, after.data() + from, (after.size() - from) * 4), 0) << "path " << k;
    for (size_t i = from; i < after.size(); ++i) ASSERT_TRUE(std::isfinite(after[i])) << "path " << k;
  }
}

// Grouped-query attention: H query heads over H / group key/value heads, the first H / group heads of a Problem's
// keys and values (its other heads NaN: never read). `copied` is the same attention with kv_group = 1: query head h
// has its own copy of key/value head h / group.
struct GroupedProblem {
  Problem p;
  int64_t group;
  std::vector<float> kt, vh;  // H heads, head h a copy of p's head h / group
  GroupedProblem(int64_t T, int64_t L, int64_t H, int64_t D, int64_t group_, uint32_t seed)
      : p(T, L, H, D, D, seed), group(group_) {
    const int64_t ks = kernels::packed_key_floats(L, D), vs = L * D;
    kt.resize(H * ks), vh.resize(H * vs);
    for (int64_t h = 0; h < H; ++h) {
      std::memcpy(kt.data() + h * ks, p.kt.data() + h / group * ks, ks * 4);
      std::memcpy(vh.data() + h * vs, p.vh.data() + h / group * vs, vs * 4);
    }
    std::fill(p.kt.begin() + H / group * ks, p.kt.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(p.vh.begin() + H / group * vs, p.vh.end(), std::numeric_limits<float>::quiet_NaN());
  }
  PrefillAttentionArgs grouped(float* out) const {
    PrefillAttentionArgs a = p.args(out);
    a.kv_group = group;
    return a;
  }
  PrefillAttentionArgs copied(float* out) const {
    PrefillAttentionArgs a = p.args(out);
    a.kt = kt.data(), a.v = vh.data();
    return a;
  }
};

// With kv_group 4 (8 query heads, 2 key/value heads) `kernel` gives, bit for bit, what it gives with each query
// head's key/value head copied into its own slot, and what the scalar definition gives, on 1 and 2 threads.
void expect_grouped_bits(Kernel kernel) {
  struct Shape { int64_t T, L; };
  uint32_t seed = 21;
  for (const Shape s : {Shape{70, 100}, Shape{300, 300}})
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const GroupedProblem g(s.T, s.L, 8, 128, 4, seed++);
      std::vector<float> got(s.T * 8 * 128, -1.0f), copied(got.size(), -2.0f), want(got.size(), -3.0f);
      kernel(g.grouped(got.data()));
      kernel(g.copied(copied.data()));
      kernels::prefill_attention_reference(g.grouped(want.data()));
      EXPECT_TRUE(same_bits(got, copied)) << "T " << s.T << " L " << s.L << " threads " << threads;
      EXPECT_TRUE(same_bits(got, want)) << "T " << s.T << " L " << s.L << " threads " << threads;
      for (float x : got) ASSERT_TRUE(std::isfinite(x));
    }
  omp_set_num_threads(omp_get_num_procs());
}

TEST(PrefillAttention, GroupedQueryKernelEqualsCopiedHeadsAndDefinition) {
  expect_grouped_bits(kernels::prefill_attention);
}

TEST(PrefillAttention, Avx2GroupedQueryKernelEqualsCopiedHeadsAndDefinition) {
  if (!kernels::prefill_attention_avx2_supported()) GTEST_SKIP() << "AVX2 path: this CPU lacks AVX2 or FMA";
  expect_grouped_bits(kernels::prefill_attention_avx2);
}

TEST(PrefillAttention, GroupedQueryDefinitionEqualsCopiedHeads) {
  expect_grouped_bits(kernels::prefill_attention_reference);
}

// Query head h reads key/value head h / kv_group, not h % (H / kv_group): with every value of key/value head g
// equal to g + 1, head h's outputs are h / 4 + 1 (heads 1, 3, 4 and 6 would read the other head under the modulo).
TEST(PrefillAttention, GroupedQueryHeadReadsKeyValueHeadHOverGroup) {
  GroupedProblem g(70, 100, 8, 128, 4, 5);
  const int64_t vs = g.p.L * g.p.Dv;
  for (int64_t kv = 0; kv < 2; ++kv) std::fill_n(g.p.vh.data() + kv * vs, vs, static_cast<float>(kv + 1));
  std::vector<Kernel> kernels_to_test = {kernels::prefill_attention, kernels::prefill_attention_reference};
  if (kernels::prefill_attention_avx2_supported()) kernels_to_test.push_back(kernels::prefill_attention_avx2);
  for (size_t k = 0; k < kernels_to_test.size(); ++k) {
    std::vector<float> out(g.p.T * g.p.H * g.p.Dv);
    kernels_to_test[k](g.grouped(out.data()));
    for (int64_t t = 0; t < g.p.T; ++t)
      for (int64_t h = 0; h < g.p.H; ++h)
        for (int64_t d = 0; d < g.p.Dv; ++d)
          ASSERT_NEAR(out[(t * g.p.H + h) * g.p.Dv + d], h / 4 + 1, 1e-5)
              << "kernel " << k << " t " << t << " head " << h;
  }
}

// Softmax attention in double precision over keys 0..pos: the float kernel is within 1e-5 of each output's scale.
TEST(PrefillAttention, MatchesSoftmaxAttentionInDouble) {
  const Problem p(96, 160, 3, 192, 128, 11);
  std::vector<float> got(p.T * p.H * p.Dv);
  const PrefillAttentionArgs a = p.args(got.data());
  kernels::prefill_attention(a);
  double worst = 0;
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t n = p.L - p.T + t + 1;
      std::vector<double> s(n);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < p.Dk; ++d) acc += double(p.q[(t * p.H + h) * p.Dk + d]) * p.k[(j * p.H + h) * p.Dk + d];
        s[j] = acc * a.scale, mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < p.Dv; ++d) {
        double o = 0, mag = 0;
        for (int64_t j = 0; j < n; ++j) o += s[j] / sum * p.v[(j * p.H + h) * p.Dv + d], mag += s[j] / sum * std::abs(p.v[(j * p.H + h) * p.Dv + d]);
        worst = std::max(worst, std::abs(got[(t * p.H + h) * p.Dv + d] - o) / std::max(mag, 1e-3));
      }
    }
  EXPECT_LT(worst, 1e-5);
}

// The definition with a window and sinks is softmax attention over the window's keys with one more term
// exp(sink) in the denominator: the scalar definition in float against that in double, within 1e-5 of each
// output's scale (Σ w_j |v_j|, whatever the sink leaves of it), GQA group 2, windows across block edges.
TEST(PrefillAttention, WindowAndSinksMatchSoftmaxInDouble) {
  Problem p(96, 160, 4, 64, 48, 19);
  p.group = 2;
  p.sinks = draw_sinks(p.H, 20);
  double worst = 0;
  for (int64_t window : {1, 5, 33, 100}) {
    p.window = window;
    std::vector<float> got(p.T * p.H * p.Dv);
    const PrefillAttentionArgs a = p.args(got.data());
    kernels::prefill_attention_reference(a);
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t h = 0; h < p.H; ++h) {
        const int64_t pos = p.L - p.T + t, lo = std::max<int64_t>(0, pos - window + 1), hk = h / p.group;
        std::vector<double> w(pos + 1 - lo);
        double mx = p.sinks[h];
        for (int64_t j = lo; j <= pos; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < p.Dk; ++d) acc += double(p.q[(t * p.H + h) * p.Dk + d]) * p.k[(j * p.H + hk) * p.Dk + d];
          w[j - lo] = acc * a.scale, mx = std::max(mx, w[j - lo]);
        }
        double sum = std::exp(double(p.sinks[h]) - mx);
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < p.Dv; ++d) {
          double o = 0, mag = 0;
          for (int64_t j = lo; j <= pos; ++j) {
            const double vj = p.v[(j * p.H + hk) * p.Dv + d];
            o += w[j - lo] / sum * vj, mag += w[j - lo] / sum * std::abs(vj);
          }
          worst = std::max(worst, std::abs(got[(t * p.H + h) * p.Dv + d] - o) / std::max(mag, 1e-30));
        }
      }
  }
  EXPECT_LT(worst, 1e-5);
}

// Keys and values past a query's own position never reach it: changing them leaves earlier queries' bits alone.
TEST(PrefillAttention, LaterKeysNeverReachEarlierQueries) {
  Problem p(80, 80, 2, 24, 16, 3);
  std::vector<float> before(p.T * p.H * p.Dv), after(before.size());
  kernels::prefill_attention(p.args(before.data()));
  const int64_t ks = kernels::packed_key_floats(p.L, p.Dk);
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t j = 50; j < p.L; ++j) {
      const std::vector<float> junk(p.Dk, 1e6f);
      kernels::pack_key_part(p.kt.data() + h * ks, p.Dk, j, 0, junk.data(), p.Dk);
      std::fill_n(p.vh.data() + (h * p.L + j) * p.Dv, p.Dv, -1e6f);
    }
  kernels::prefill_attention(p.args(after.data()));
  const size_t cut = 50 * p.H * p.Dv;
  EXPECT_EQ(std::memcmp(before.data(), after.data(), cut * 4), 0);
  EXPECT_NE(std::memcmp(before.data() + cut, after.data() + cut, (before.size() - cut) * 4), 0);
}

}  // namespace
}  // namespace kestrel
