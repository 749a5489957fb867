// DSA lightning indexer + sparse MLA (src/kernels/cpu/dsa_indexer.h, src/layers/dsa_indexer.h) against
// goldens from tools/gen_dsa_goldens.py: a PyTorch-on-CPU transcription of DeepSeek-V3.2-Exp's
// reference Indexer / act_quant / fp8_index / index-masked MLA (fp32, NeoX indexer RoPE per the
// 2025-11-17 fix).
//
// Tolerances and why:
//  - q/k before quantization (matmul + LayerNorm + RoPE + Hadamard): fp32 on both sides, different
//    summation order (the golden's Hadamard is an fp64 matrix product) → 1e-5 relative to max|ref|.
//  - e4m3 codes and scales from IDENTICAL inputs (the golden's pre-quant tensors): bit-exact.
//  - codes from our own pre-quant values: a value within rounding noise of an e4m3 rounding boundary
//    may land one code step away; we require ≥ 99% identical and every mismatch exactly one step.
//  - index scores from identical codes: the products of e4m3 values are exact in fp32, only the
//    fp32 summation order differs → 1e-5 relative to the row's max |score|.
//  - top-k sets: must be IDENTICAL, except that a swapped pair is allowed when the reference scores
//    of the two positions tie exactly (none occur in these goldens; the count is printed).
//  - sparse attention: fp32 online softmax vs the golden's fp64 masked softmax → 2e-5 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dsa_indexer.h"
#include "layers/dsa_indexer.h"
#include "loader/safetensors.h"

namespace kestrel {
namespace {

struct Golden {
  std::map<std::string, std::vector<float>> f;
  std::map<std::string, std::vector<uint8_t>> u8;
  std::map<std::string, std::string> meta;
  int64_t m(const std::string& k) const { return std::stoll(meta.at(k)); }
};

Golden load(const std::string& name) {
  Golden g;
  const std::string path = std::string(KESTREL_TEST_DATA) + "/dsa/" + name + ".safetensors";
  auto file = SafetensorsFile::open(path);
  if (!file) {
    ADD_FAILURE() << "cannot open " << path << ": " << file.error().message();
    return g;
  }
  for (const auto& e : file->header().entries) {
    TensorView tv = file->view(e);
    if (tv.dtype == DType::kF32) g.f[e.name].assign(tv.as<float>(), tv.as<float>() + tv.numel());
    else if (tv.dtype == DType::kU8) g.u8[e.name].assign(tv.as<uint8_t>(), tv.as<uint8_t>() + tv.numel());
    else ADD_FAILURE() << "unexpected dtype for " << e.name;
  }
  g.meta = file->header().metadata;
  return g;
}

double max_abs(const float* p, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(p[i])));
  return m;
}

double max_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

kernels::WeightMatrix f32w(const std::vector<float>& v, int64_t out, int64_t in) {
  EXPECT_EQ(static_cast<int64_t>(v.size()), out * in);
  return kernels::WeightMatrix{kernels::WeightFormat::kF32, out, in, v.data(), nullptr};
}

// Paged indexer key cache owned by the test.
struct Pages {
  std::vector<std::vector<uint8_t>> mem;
  IndexerCache view;
  Pages(int64_t tokens, int64_t page_tokens, int64_t row_bytes) {
    view.page_tokens = page_tokens;
    for (int64_t p = 0; p * page_tokens < tokens; ++p) {
      mem.emplace_back(static_cast<size_t>(page_tokens * row_bytes));
      view.pages.push_back(mem.back().data());
    }
  }
};

// Set of valid positions in row t of a [T, topk] index array.
std::set<int32_t> row_set(const std::vector<int32_t>& idx, int64_t t, int64_t topk) {
  std::set<int32_t> s;
  for (int64_t j = 0; j < topk; ++j)
    if (idx[static_cast<size_t>(t * topk + j)] >= 0) s.insert(idx[static_cast<size_t>(t * topk + j)]);
  return s;
}

std::set<int32_t> golden_set(const Golden& g, int64_t t) {
  const int64_t T = g.m("T");
  std::set<int32_t> s;
  for (int64_t j = 0; j < T; ++j)
    if (g.u8.at("selected")[static_cast<size_t>(t * T + j)]) s.insert(static_cast<int32_t>(j));
  return s;
}

// Compares a selection with the golden one; a difference is only allowed between positions whose
// reference scores tie exactly. Returns the number of tolerated tie swaps.
int expect_same_selection(const Golden& g, const std::vector<int32_t>& idx, int64_t topk, const std::string& what) {
  const int64_t T = g.m("T");
  int ties = 0;
  for (int64_t t = 0; t < T; ++t) {
    const auto got = row_set(idx, t, topk), want = golden_set(g, t);
    EXPECT_EQ(got.size(), want.size()) << what << " row " << t;
    std::vector<int32_t> extra, missing;
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
    const float* sc = g.f.at("scores").data() + t * T;
    for (size_t i = 0; i < extra.size() && i < missing.size(); ++i) {
      EXPECT_EQ(sc[extra[i]], sc[missing[i]]) << what << " row " << t << ": selected " << extra[i] << " (score "
                                              << sc[extra[i]] << ") instead of " << missing[i] << " (score "
                                              << sc[missing[i]] << ")";
      ++ties;
    }
  }
  return ties;
}

class DsaGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(DsaGolden, ActQuantIsBitExactOnReferenceInputs) {
  const Golden g = load(GetParam());
  const int64_t T = g.m("T"), H = g.m("H"), D = g.m("D");
  std::vector<uint8_t> codes(static_cast<size_t>(D));
  for (int64_t r = 0; r < T * H; ++r) {
    const float s = kernels::quantize_e4m3_block(g.f.at("q_pre").data() + r * D, D, true, codes.data());
    ASSERT_EQ(s, g.f.at("q_scale")[static_cast<size_t>(r)]) << "q row " << r;
    ASSERT_EQ(0, std::memcmp(codes.data(), g.u8.at("q_codes").data() + r * D, static_cast<size_t>(D))) << "q row " << r;
  }
  for (int64_t t = 0; t < T; ++t) {
    const float s = kernels::quantize_e4m3_block(g.f.at("k_pre").data() + t * D, D, true, codes.data());
    ASSERT_EQ(s, g.f.at("k_scale")[static_cast<size_t>(t)]) << "k row " << t;
    ASSERT_EQ(0, std::memcmp(codes.data(), g.u8.at("k_codes").data() + t * D, static_cast<size_t>(D))) << "k row " << t;
  }
}

// Scores and top-k from the reference's own codes: isolates the kernel from upstream rounding.
TEST_P(DsaGolden, TopkKernelOnReferenceCodes) {
  const Golden g = load(GetParam());
  const int64_t T = g.m("T"), H = g.m("H"), D = g.m("D"), K = g.m("topk");
  const int64_t row = kernels::indexer_row_bytes(D);
  for (int64_t page_tokens : {5, 16, 64}) {
    Pages pg(T, page_tokens, row);
    for (int64_t t = 0; t < T; ++t) {
      uint8_t* dst = pg.view.pages[static_cast<size_t>(t / page_tokens)] + (t % page_tokens) * row;
      std::memcpy(dst, g.u8.at("k_codes").data() + t * D, static_cast<size_t>(D));
      std::memcpy(dst + D, &g.f.at("k_scale")[static_cast<size_t>(t)], 4);
    }
    kernels::IndexerTopkArgs a;
    a.T = T, a.L = T, a.H = H, a.D = D, a.topk = K;
    a.q = g.u8.at("q_codes").data(), a.w = g.f.at("weights").data();
    a.pages = pg.view.pages.data(), a.page_tokens = page_tokens;
    std::vector<int32_t> idx(static_cast<size_t>(T * K));
    a.out = idx.data();
    kernels::indexer_topk(a);
    const int ties = expect_same_selection(g, idx, K, "page_tokens " + std::to_string(page_tokens));
    std::printf("[ %s ] page_tokens %lld: exact-tie swaps %d\n", GetParam(), static_cast<long long>(page_tokens), ties);
    // Scores (scalar path) within fp32 summation-order noise.
    std::vector<float> sc(static_cast<size_t>(T));
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
      kernels::indexer_scores_reference(a, t, t + 1, sc.data());
      const float* ref = g.f.at("scores").data() + t * T;
      worst = std::max(worst, max_diff(sc.data(), ref, static_cast<size_t>(t + 1)) /
                                  std::max(1e-30, max_abs(ref, static_cast<size_t>(t + 1))));
    }
    EXPECT_LE(worst, 1e-5);
    if (page_tokens == 16) std::printf("[ %s ] max relative score error %.3g\n", GetParam(), worst);
  }
}

// The whole layer (projections, LayerNorm, NeoX RoPE, Hadamard, act_quant, head weights, cache,
// top-k) from the reference weights and inputs, prefilled in several chunkings.
TEST_P(DsaGolden, IndexerLayerMatchesReference) {
  const Golden g = load(GetParam());
  const int64_t T = g.m("T"), H = g.m("H"), D = g.m("D"), K = g.m("topk"), hid = g.m("hid"), ql = g.m("q_lora");
  DsaIndexerDims d;
  d.hidden = hid, d.q_lora = ql, d.H = H, d.D = D, d.rope = g.m("rope"), d.topk = K, d.rope_theta = 10000.0f;
  for (int64_t chunk : {T, g.m("prefill"), int64_t{7}, int64_t{1}}) {
    DsaIndexer ix;
    ix.init(d, f32w(g.f.at("wq_b"), H * D, ql), f32w(g.f.at("wk"), D, hid), f32w(g.f.at("weights_proj"), H, hid),
            g.f.at("k_norm_w"), g.f.at("k_norm_b"));
    Pages pg(T, 16, ix.row_bytes());
    std::vector<int32_t> idx(static_cast<size_t>(T * K));
    std::vector<float> qpre, kpre, w;
    std::vector<uint8_t> q8;
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t n = std::min(chunk, T - s);
      const Segment<IndexerCache> seg{0, n, &pg.view};
      std::vector<int32_t> part(static_cast<size_t>(n * K));
      ix.forward(g.f.at("x").data() + s * hid, g.f.at("qr").data() + s * ql, n, std::span(&seg, 1), part.data());
      std::copy(part.begin(), part.end(), idx.begin() + s * K);
      qpre.insert(qpre.end(), ix.q_pre().begin(), ix.q_pre().begin() + n * H * D);
      kpre.insert(kpre.end(), ix.k_pre().begin(), ix.k_pre().begin() + n * D);
      w.insert(w.end(), ix.head_weights().begin(), ix.head_weights().begin() + n * H);
      q8.insert(q8.end(), ix.q_codes().begin(), ix.q_codes().begin() + n * H * D);
    }
    EXPECT_EQ(pg.view.n_tokens, T);
    const std::string what = "chunk " + std::to_string(chunk);
    const auto& rq = g.f.at("q_pre");
    const auto& rk = g.f.at("k_pre");
    EXPECT_LE(max_diff(qpre.data(), rq.data(), rq.size()), 1e-5 * max_abs(rq.data(), rq.size())) << what;
    EXPECT_LE(max_diff(kpre.data(), rk.data(), rk.size()), 1e-5 * max_abs(rk.data(), rk.size())) << what;
    // Codes: ≥ 99% identical, the rest one e4m3 step away (boundary cases of rounding noise).
    size_t same = 0, one_step = 0;
    const auto& rc = g.u8.at("q_codes");
    for (size_t i = 0; i < rc.size(); ++i) {
      if (q8[i] == rc[i]) ++same;
      else if ((q8[i] & 0x80) == (rc[i] & 0x80) && std::abs((q8[i] & 0x7f) - (rc[i] & 0x7f)) == 1) ++one_step;
    }
    EXPECT_EQ(same + one_step, rc.size()) << what;
    EXPECT_GE(static_cast<double>(same), 0.99 * static_cast<double>(rc.size())) << what;
    const auto& rw = g.f.at("weights");
    EXPECT_LE(max_diff(w.data(), rw.data(), rw.size()), 1e-5 * max_abs(rw.data(), rw.size())) << what;
    const int ties = expect_same_selection(g, idx, K, what);
    std::printf("[ %s ] %s: %zu/%zu q codes identical, exact-tie swaps %d\n", GetParam(), what.c_str(), same,
                rc.size(), ties);
  }
}

// Sparse MLA over gathered rows vs the reference's dense-scores + index-mask softmax.
TEST_P(DsaGolden, SparseAttentionMatchesReference) {
  const Golden g = load(GetParam());
  const int64_t T = g.m("T"), Ha = g.m("Ha"), Dk = g.m("Dk"), Dv = g.m("Dv"), K = g.m("topk");
  const float scale = std::stof(g.meta.at("scale"));
  const int64_t page_tokens = 8;
  std::vector<std::vector<float>> mem;
  std::vector<float*> pages;
  for (int64_t p = 0; p * page_tokens < T; ++p) {
    mem.emplace_back(static_cast<size_t>(page_tokens * Dk));
    pages.push_back(mem.back().data());
  }
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(g.f.at("kv").data() + t * Dk, Dk, pages[static_cast<size_t>(t / page_tokens)] + (t % page_tokens) * Dk);
  // Index lists from the reference selection (ascending, −1 padded).
  std::vector<int32_t> idx(static_cast<size_t>(T * K), -1);
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = 0;
    for (int32_t j : golden_set(g, t)) idx[static_cast<size_t>(t * K + n++)] = j;
  }
  std::vector<float> out(static_cast<size_t>(T * Ha * Dv));
  std::vector<const uint8_t*> byte_pages;  // fp32 latent rows [Dv latent | Dk − Dv rope]
  for (const float* p : pages) byte_pages.push_back(reinterpret_cast<const uint8_t*>(p));
  const kernels::KvRowFormat row{KvCacheDtype::kF32, Dv, Dk - Dv};
  kernels::SparseMlaArgs a;
  a.T = T, a.H = Ha, a.Dk = Dk, a.Dv = Dv, a.topk = K, a.q = g.f.at("q_lat").data();
  a.pages = byte_pages.data(), a.page_tokens = page_tokens, a.row = row, a.idx = idx.data(), a.scale = scale;
  a.out = out.data();
  kernels::sparse_mla_attention(a);
  const auto& ref = g.f.at("out_sparse");
  const double err = max_diff(out.data(), ref.data(), ref.size());
  EXPECT_LE(err, 2e-5 * max_abs(ref.data(), ref.size()));
  std::printf("[ %s ] sparse attention max abs error %.3g (max|ref| %.3g)\n", GetParam(), err,
              max_abs(ref.data(), ref.size()));
  // When every causal position is selected (top-k ≥ length), DSA is dense MLA: compare with the
  // reference dense output and with our dense causal kernel.
  if (K >= T) {
    const auto& dense = g.f.at("out_dense");
    EXPECT_LE(max_diff(out.data(), dense.data(), dense.size()), 2e-5 * max_abs(dense.data(), dense.size()));
    std::vector<float> ours(out.size());
    kernels::AttentionArgs c;
    c.T = T, c.L = T, c.H = Ha, c.Dk = Dk, c.Dv = Dv, c.q = g.f.at("q_lat").data();
    c.pages = byte_pages.data(), c.page_tokens = page_tokens, c.row = row;
    c.scale = scale, c.out = ours.data();
    kernels::causal_attention(c);
    EXPECT_EQ(ours, out) << "dense causal MLA is the sparse kernel with every causal row selected, bit for bit";
  } else {
    // And the case really is sparse: it differs from dense attention.
    const auto& dense = g.f.at("out_dense");
    EXPECT_GT(max_diff(out.data(), dense.data(), dense.size()), 1e-2 * max_abs(dense.data(), dense.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, DsaGolden, ::testing::Values("indexer", "indexer_bigk"));

TEST(DsaKernels, HadamardIsTheSylvesterMatrix) {
  // Definition check: H[i][j] = (-1)^popcount(i & j) / sqrt(n).
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 2, 8, 128}) {
    std::vector<float> x(static_cast<size_t>(n)), y(x.size());
    for (auto& v : x) v = nd(rng);
    y = x;
    kernels::hadamard_rotate(y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * x[static_cast<size_t>(j)];
      EXPECT_NEAR(y[static_cast<size_t>(i)], s / std::sqrt(static_cast<double>(n)), 1e-5) << n << " " << i;
    }
  }
}

TEST(DsaKernels, RopeNeoxIsTheHalfSplitRotationTimesMagnitude) {
  // Definition check: pairs (i, i + rope/2) rotated by pos · inv_freq[i], cos/sin scaled by mag (the
  // YaRN attention factor V3.2's indexer shares with the model's RoPE); dims ≥ rope untouched.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t n = 128, rope = 32, pos = 1234;
  std::vector<float> inv_freq(rope / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(0.7f, static_cast<float>(i)) / (1.0f + static_cast<float>(i % 3));
  for (float mag : {1.0f, 1.3f}) {
    std::vector<float> x(static_cast<size_t>(n)), y;
    for (auto& v : x) v = nd(rng);
    y = x;
    kernels::rope_neox(y.data(), rope, pos, inv_freq.data(), mag);
    for (int64_t i = 0; i < rope / 2; ++i) {
      const double a = static_cast<double>(pos) * inv_freq[static_cast<size_t>(i)];
      const double c = std::cos(a) * mag, sn = std::sin(a) * mag;
      const double x0 = x[static_cast<size_t>(i)], x1 = x[static_cast<size_t>(i + rope / 2)];
      // fp32 angle (pos · inv_freq rounded to fp32) vs fp64: |Δangle| ≤ ~1e-4 at pos 1234.
      EXPECT_NEAR(y[static_cast<size_t>(i)], x0 * c - x1 * sn, 1e-3) << mag << " " << i;
      EXPECT_NEAR(y[static_cast<size_t>(i + rope / 2)], x0 * sn + x1 * c, 1e-3) << mag << " " << i;
    }
    for (int64_t i = rope; i < n; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)]);
  }
}

TEST(DsaKernels, E4m3EncodeRoundTripsEveryCode) {
  const float* lut = kernels::e4m3_table();
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    if (c == 0x80) continue;           // -0 → encodes as 0x80 too, but compare by value below
    EXPECT_EQ(kernels::f32_to_e4m3(lut[c]), c) << c;
  }
  // Midpoints round to even; saturation at 448.
  EXPECT_EQ(kernels::f32_to_e4m3(1.0625f), 0x38);   // between 1.0 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(kernels::f32_to_e4m3(1.1875f), 0x3a);   // between 1.125 and 1.25: even (0x3a)
  EXPECT_EQ(kernels::f32_to_e4m3(3.0f / 1024), 0x02);  // subnormal midpoint 1.5·2^-9 → 2·2^-9
  EXPECT_EQ(kernels::f32_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(kernels::f32_to_e4m3(-1000.0f), 0xfe);
}

// Streaming top-k (tiles, key splits, pages) vs brute force on larger random inputs: decode-like
// (few queries → key splits + merge) and prefill-like (many queries, causal).
TEST(DsaKernels, StreamingTopkEqualsBruteForce) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> code(0, 0x7e);
  std::uniform_real_distribution<float> uw(-1.0f, 1.0f);
  for (auto [T, L, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 5000, 64}, {3, 3001, 200}, {70, 2000, 96}, {20, 20, 4}}) {
    const int64_t H = 3, D = 128, row = kernels::indexer_row_bytes(D), page_tokens = 64;
    Pages pg(L, page_tokens, row);
    for (int64_t j = 0; j < L; ++j) {
      uint8_t* r = pg.view.pages[static_cast<size_t>(j / page_tokens)] + (j % page_tokens) * row;
      for (int64_t i = 0; i < D; ++i) r[i] = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
      const float s = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 8);
      std::memcpy(r + D, &s, 4);
    }
    std::vector<uint8_t> q(static_cast<size_t>(T * H * D));
    for (auto& c : q) c = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
    std::vector<float> w(static_cast<size_t>(T * H));
    for (auto& v : w) v = uw(rng);
    kernels::IndexerTopkArgs a;
    a.T = T, a.L = L, a.H = H, a.D = D, a.topk = K, a.q = q.data(), a.w = w.data();
    a.pages = pg.view.pages.data(), a.page_tokens = page_tokens;
    std::vector<int32_t> idx(static_cast<size_t>(T * K));
    a.out = idx.data();
    kernels::indexer_topk(a);
    std::vector<float> sc(static_cast<size_t>(L));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = L - T + t + 1;
      kernels::indexer_scores_reference(a, t, n, sc.data());
      std::vector<int32_t> order(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) order[static_cast<size_t>(j)] = static_cast<int32_t>(j);
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return sc[static_cast<size_t>(x)] > sc[static_cast<size_t>(y)]; });
      const int64_t keep = std::min(K, n);
      const auto got = row_set(idx, t, K);
      ASSERT_EQ(static_cast<int64_t>(got.size()), keep);
      // Ascending positions, then -1 padding.
      for (int64_t j = 1; j < keep; ++j) EXPECT_LT(idx[static_cast<size_t>(t * K + j - 1)], idx[static_cast<size_t>(t * K + j)]);
      for (int64_t j = keep; j < K; ++j) EXPECT_EQ(idx[static_cast<size_t>(t * K + j)], -1);
      // Every selected score ≥ the k-th best (up to fp32-vs-fp64 scoring noise at the boundary).
      const float kth = sc[static_cast<size_t>(order[static_cast<size_t>(keep - 1)])];
      const double tol = 1e-5 * std::max(1e-30, static_cast<double>(std::fabs(sc[static_cast<size_t>(order[0])])));
      for (int32_t j : got) EXPECT_GE(sc[static_cast<size_t>(j)], kth - tol) << "T " << T << " L " << L << " t " << t;
      int mism = 0;
      for (int64_t j = 0; j < keep; ++j) mism += got.count(order[static_cast<size_t>(j)]) ? 0 : 1;
      EXPECT_LE(mism, 1) << "T " << T << " L " << L << " t " << t;
    }
  }
}

}  // namespace
}  // namespace kestrel
