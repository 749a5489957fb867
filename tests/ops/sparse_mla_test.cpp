// The key-tiled sparse MLA kernel (kernels/cpu/sparse_mla_attention.cpp) and its fixed-order dot product
// (kernels/cpu/lane_dot.h): the AVX-512 form and the AVX2 + FMA form each equal the scalar definition bit for
// bit over shapes at every tile and lane edge, −1 entries anywhere, every cache dtype; a query's output does not depend on the other
// queries, the head grouping or the thread count; the definition itself agrees with double-precision
// softmax attention over the selected rows. (The reference comparison against DeepSeek's own sparse
// attention is tests/ops/dsa_test.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/kv_row.h"
#include "kernels/cpu/lane_dot.h"
#include "kernels/cpu/sparse_mla_tiles.h"

namespace kestrel {
namespace {

struct Case {
  int64_t T, H, lora, rope, L, topk;
  KvCacheDtype dtype;
};

struct Paged {
  std::vector<std::vector<uint8_t>> mem;
  std::vector<const uint8_t*> pages;
  std::vector<float> q;
  std::vector<int32_t> idx;
  kernels::SparseMlaArgs a;
};

// L cached rows in pages of 7 tokens, random queries, per query a random ascending selection of causal
// positions with −1 entries scattered through it (not only at the end).
Paged make(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Paged s;
  const kernels::KvRowFormat row{c.dtype, c.lora, c.rope};
  const int64_t page_tokens = 7, Dk = c.lora + c.rope;
  std::vector<float> x(static_cast<size_t>(Dk));
  for (int64_t p = 0; p * page_tokens < c.L; ++p) {
    s.mem.emplace_back(static_cast<size_t>(page_tokens * row.bytes()));
    for (int64_t r = 0; r < page_tokens; ++r) {
      for (auto& v : x) v = 2.0f * nd(rng);
      kernels::kv_store_row(row, x.data(), s.mem.back().data() + r * row.bytes());
    }
  }
  for (auto& m : s.mem) s.pages.push_back(m.data());
  s.q.resize(static_cast<size_t>(c.T * c.H * Dk));
  for (auto& v : s.q) v = nd(rng);
  s.idx.assign(static_cast<size_t>(c.T * c.topk), -1);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t pos = c.L - c.T + t;
    int64_t n = 0;
    for (int64_t j = 0; j <= pos && n < c.topk; ++j)
      if (rng() % 3 != 0) {
        s.idx[static_cast<size_t>(t * c.topk + n)] = rng() % 5 == 0 ? -1 : static_cast<int32_t>(j);
        ++n;
      }
  }
  s.a.T = c.T, s.a.H = c.H, s.a.Dk = Dk, s.a.Dv = c.lora, s.a.topk = c.topk, s.a.q = s.q.data();
  s.a.pages = s.pages.data(), s.a.page_tokens = page_tokens, s.a.row = row, s.a.idx = s.idx.data();
  s.a.scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  return s;
}

std::vector<float> run(kernels::SparseMlaArgs a, void (*kernel)(const kernels::SparseMlaArgs&)) {
  std::vector<float> out(static_cast<size_t>(a.T * a.H * a.Dv), -7.0f);
  a.out = out.data();
  kernel(a);
  return out;
}

std::vector<float> run(kernels::SparseMlaArgs a, bool reference) {
  return run(a, reference ? kernels::sparse_mla_attention_reference : kernels::sparse_mla_attention);
}

bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }

const Case kCases[] = {
    {3, 5, 128, 16, 40, 6, KvCacheDtype::kF32},     // fewer keys than a tile
    {4, 3, 144, 16, 90, 37, KvCacheDtype::kF32},    // Dk 160, Dv 144: partial 64-wide value chunk
    {2, 17, 40, 9, 120, 64, KvCacheDtype::kF32},    // Dk 49 (masked dot tail), more heads than a group
    {5, 4, 512, 64, 300, 100, KvCacheDtype::kBF16},  // DeepSeek widths
    {3, 2, 512, 64, 200, 33, KvCacheDtype::kFP8},
    {1, 1, 16, 0, 1, 1, KvCacheDtype::kF32},        // one key
    {3, 3, 21, 7, 50, 23, KvCacheDtype::kF32},      // Dv 21, Dk 28: masked 8-lane value and dot tails
    {2, 3, 40, 8, 1300, 1100, KvCacheDtype::kF32},   // 3 spans (sparse: the last one all −1), dense 3 spans
    {1, 16, 512, 64, 1100, 1050, KvCacheDtype::kBF16},  // a lone query of 16 heads: spans spread over threads
    {1, 2, 16, 0, 9000, 9000, KvCacheDtype::kF32},   // 16 spans of 576 entries
};

// The path the CPU takes (AVX-512, else AVX2 + FMA).
TEST(SparseMla, KernelEqualsItsScalarDefinitionBitForBit) {
  if (!cpu_has_avx512() && !kernels::sparse_mla_attention_avx2_supported())
    GTEST_SKIP() << "neither AVX-512 nor AVX2 + FMA on this CPU: the kernel runs the scalar definition itself";
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const Paged s = make(c, seed++);
    EXPECT_EQ(run(s.a, false), run(s.a, true)) << "T " << c.T << " H " << c.H << " lora " << c.lora;
  }
}

// The AVX2 + FMA tile step, forced (on AVX-512 CPUs too): the same cases, on 1 and 2 threads (other head
// groupings, so pairs of heads and single heads both run).
TEST(SparseMla, Avx2KernelEqualsItsScalarDefinitionBitForBit) {
  if (!kernels::sparse_mla_attention_avx2_supported()) GTEST_SKIP() << "AVX2 path: this CPU lacks AVX2 or FMA";
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const Paged s = make(c, seed++);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      EXPECT_EQ(run(s.a, kernels::sparse_mla_attention_avx2), run(s.a, true))
          << "T " << c.T << " H " << c.H << " lora " << c.lora << " threads " << threads;
    }
  }
  omp_set_num_threads(2);
}

TEST(SparseMla, AQuerysBitsDependOnNothingElse) {
  for (const Case& c : kCases) {
    const Paged s = make(c, 77);
    const std::vector<float> all = run(s.a, false);
    for (int threads : {1, 2, 3}) {  // other head groups and work splits
      omp_set_num_threads(threads);
      EXPECT_EQ(run(s.a, false), all) << threads << " threads";
    }
    omp_set_num_threads(2);
    for (int64_t t = 0; t < c.T; ++t) {  // each query alone: one work item per head group of its own
      kernels::SparseMlaArgs one = s.a;
      one.T = 1, one.q = s.a.q + t * c.H * one.Dk, one.idx = s.a.idx + t * c.topk;
      const std::vector<float> alone = run(one, false);
      const std::vector<float> part(all.begin() + t * c.H * c.lora, all.begin() + (t + 1) * c.H * c.lora);
      EXPECT_EQ(alone, part) << "query " << t;
    }
  }
}

// Dense causal MLA (attention.h) is the tile kernel with every causal row selected: causal_attention equals
// the scalar definition over idx = 0..L−T+t, bit for bit, on 1, 2 and 3 threads (head groups of the whole
// query, of H / threads heads, partial ones), and several sequences in one call equal the calls one by one.
TEST(SparseMla, DenseCausalAttentionIsTheKernelOverEveryRow) {
  uint32_t seed = 11;
  for (const Case& c : kCases) {
    Paged s = make(c, seed++);
    s.idx.assign(static_cast<size_t>(c.T * c.L), -1);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j <= c.L - c.T + t; ++j) s.idx[static_cast<size_t>(t * c.L + j)] = static_cast<int32_t>(j);
    s.a.topk = c.L, s.a.idx = s.idx.data();
    const std::vector<float> want = run(s.a, true);
    kernels::AttentionArgs d;
    d.T = c.T, d.L = c.L, d.H = c.H, d.Dk = s.a.Dk, d.Dv = s.a.Dv, d.q = s.a.q, d.pages = s.a.pages;
    d.page_tokens = s.a.page_tokens, d.row = s.a.row, d.scale = s.a.scale;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> got(want.size(), -7.0f);
      d.out = got.data();
      kernels::causal_attention(d);
      EXPECT_EQ(got, want) << "T " << c.T << " H " << c.H << " lora " << c.lora << " threads " << threads;
    }
    omp_set_num_threads(2);
    // Each query as a sequence of its own (the decode segments of a batch), all in one call.
    std::vector<kernels::AttentionArgs> many;
    std::vector<float> got(want.size(), -7.0f);
    for (int64_t t = 0; t < c.T; ++t) {
      kernels::AttentionArgs one = d;
      one.T = 1, one.L = c.L - c.T + t + 1, one.q = d.q + t * c.H * d.Dk, one.out = got.data() + t * c.H * d.Dv;
      many.push_back(one);
    }
    kernels::causal_attention_many(many);
    EXPECT_EQ(got, want) << "T " << c.T << " H " << c.H << " lora " << c.lora << " as " << c.T << " sequences";
  }
}

// Spans: at least 512 list entries, a whole number of key tiles, at most 16 per list, covering it.
TEST(SparseMla, SpansCoverTheListInAtMostSixteen) {
  namespace st = kernels::sparse_tiles;
  EXPECT_EQ(st::span_count(0), 0);
  EXPECT_EQ(st::span_count(1), 1);
  EXPECT_EQ(st::span_count(512), 1);
  EXPECT_EQ(st::span_count(513), 2);
  EXPECT_EQ(st::span_count(8192), 16);
  EXPECT_EQ(st::span_rows(9000), 576);
  for (int64_t n : {1, 511, 512, 513, 4096, 8191, 8193, 16384, 100000, 1 << 20}) {
    const int64_t S = st::span_rows(n), k = st::span_count(n);
    EXPECT_GE(S, 512);
    EXPECT_EQ(S % kernels::kSparseKeyTile, 0);
    EXPECT_LE(k, 16) << n;
    EXPECT_GE(k * S, n);
    EXPECT_LT((k - 1) * S, n);
  }
}

// A span's state merged into a running one: the merge's definition in double precision (both orders of the
// running max), an empty span changing nothing, a span into an empty state copied.
TEST(SparseMla, SpanMergeIsTheSoftmaxOfBothSpans) {
  namespace st = kernels::sparse_tiles;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (const float dm : {-3.0f, 0.0f, 2.5f}) {
    const int64_t Dv = 37;
    std::vector<float> O(Dv), o(Dv);
    for (auto& v : O) v = nd(rng);
    for (auto& v : o) v = nd(rng);
    float M = 1.0f, L = 3.0f;
    const float m = 1.0f + dm, l = 2.0f;
    std::vector<float> want(Dv);
    const double x = std::max(M, m), ea = std::exp(double(M) - x), eb = std::exp(double(m) - x);
    for (int64_t d = 0; d < Dv; ++d) want[d] = static_cast<float>(O[d] * ea + o[d] * eb);
    const double Lw = L * ea + l * eb;
    st::merge_span(M, L, O.data(), m, l, o.data(), Dv);
    EXPECT_EQ(M, static_cast<float>(x));
    EXPECT_NEAR(L, Lw, 1e-6 * Lw);
    for (int64_t d = 0; d < Dv; ++d) EXPECT_NEAR(O[d], want[d], 1e-5) << d;
    const std::vector<float> before = O;
    st::merge_span(M, L, O.data(), -INFINITY, 0.0f, o.data(), Dv);  // an empty span
    EXPECT_EQ(O, before);
    float M0 = -INFINITY, L0 = 0.0f;
    std::vector<float> O0(Dv, 0.0f);
    st::merge_span(M0, L0, O0.data(), m, l, o.data(), Dv);
    EXPECT_EQ(M0, m);
    EXPECT_EQ(L0, l);
    EXPECT_EQ(O0, o);
  }
}

// The definition against softmax attention in double precision over the same selected rows (decoded), on one
// thread (a query's spans folded in as they come) and on two (spans of the lone queries spread, then merged).
TEST(SparseMla, DefinitionAgreesWithDoublePrecisionSoftmax) {
  for (const Case& c : kCases) {
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const Paged s = make(c, 5);
      const std::vector<float> got = run(s.a, true);
      const int64_t Dk = s.a.Dk, Dv = s.a.Dv;
      std::vector<float> row(static_cast<size_t>(Dk));
      double worst = 0, scale = 0;
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t h = 0; h < c.H; ++h) {
          const float* q = s.q.data() + (t * c.H + h) * Dk;
          std::vector<double> sc, o(static_cast<size_t>(Dv), 0.0);
          std::vector<std::vector<float>> rows;
          for (int64_t i = 0; i < c.topk; ++i) {
            const int32_t j = s.idx[static_cast<size_t>(t * c.topk + i)];
            if (j < 0) continue;
            kernels::kv_load_row(s.a.row, s.pages[j / 7] + (j % 7) * s.a.row.bytes(), Dk, row.data());
            double d = 0;
            for (int64_t k = 0; k < Dk; ++k) d += static_cast<double>(q[k]) * row[static_cast<size_t>(k)];
            sc.push_back(d * s.a.scale);
            rows.push_back(row);
          }
          if (sc.empty()) continue;
          double mx = sc[0], sum = 0;
          for (double v : sc) mx = std::max(mx, v);
          for (size_t i = 0; i < sc.size(); ++i) {
            const double w = std::exp(sc[i] - mx);
            sum += w;
            for (int64_t d = 0; d < Dv; ++d) o[static_cast<size_t>(d)] += w * rows[i][static_cast<size_t>(d)];
          }
          for (int64_t d = 0; d < Dv; ++d) {
            const double want = o[static_cast<size_t>(d)] / sum;
            worst = std::max(worst, std::fabs(want - got[static_cast<size_t>((t * c.H + h) * Dv + d)]));
            scale = std::max(scale, std::fabs(want));
          }
        }
      // fp32 dot products of ≤ 576 terms and weighted sums of ≤ 9000 terms (in tiles of 16 and spans merged in
      // order): a few ulps of the largest value each.
      EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "lora " << c.lora << " topk " << c.topk << " threads " << threads;
    }
  }
  omp_set_num_threads(2);
}

TEST(LaneDot, VectorFormEqualsTheDefinitionAndTheDefinitionIsADot) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 15, 16, 17, 31, 48, 49, 512, 576}) {
    std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(4 * n));
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    const float* rows[4] = {w.data(), w.data() + n, w.data() + 2 * n, w.data() + 3 * n};
    float out[4], out2[4] = {};
    kernels::lane_dot4(x.data(), rows, n, out);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2) kernels::lane_dot4_avx2(x.data(), rows, n, out2);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(out[r], kernels::lane_dot(x.data(), rows[r], n)) << n << " row " << r;
      if (avx2) {
        EXPECT_EQ(out2[r], kernels::lane_dot(x.data(), rows[r], n)) << "AVX2 form, n " << n << " row " << r;
      }
      double d = 0, mag = 0;
      for (int64_t k = 0; k < n; ++k) {
        d += static_cast<double>(x[static_cast<size_t>(k)]) * rows[r][k];
        mag += std::fabs(static_cast<double>(x[static_cast<size_t>(k)]) * rows[r][k]);
      }
      EXPECT_NEAR(out[r], d, 1e-6 * mag + 1e-30) << n;
    }
  }
}

}  // namespace
}  // namespace kestrel
