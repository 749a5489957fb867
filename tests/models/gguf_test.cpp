// Models loaded from GGUF files written by llama.cpp's converter (tests/data/gguf, made by
// tools/gen_gguf_goldens.py from `kestrel make-model` micro checkpoints):
//   (a) GGUF vs the very same checkpoint loaded from safetensors (generated here). Kimi Linear BF16
//       file and K3 MXFP4-expert file (rest BF16): the weights are the same bits. Differences can only
//       come from A_log (the file holds −exp(A_log); we take log(−x), then exp again: ≤ 2 ulp on the
//       decay rate) and, for MXFP4, from the kernel path (compressed-tensors MXFP4 takes the fused
//       decode+dot for ≤ 4 tokens per expert, GGUF MXFP4 the decode-then-dot path: same summation order,
//       bit-identical when both are compiled with FMA contraction). Measured: 0 (release build), ≤ 1.2e-5
//       (debug ASan build: no FMA, other rounding). F16 file (converted from the BF16 checkpoint): BF16
//       weights below 2^-14 become F16 subnormals and lose bits: measured 6.4e-6 (release), 1.7e-5
//       (debug). Bound for all: max |Δlogit| ≤ 1e-4 on logits of magnitude ~4, same argmax everywhere
//       (a wrong mapping, transpose or expert slice is ≥ 1e-2).
//       deepseek2 (DeepSeek V3 micro, BF16 and F16 files): measured 4.95e-6 / 4.83e-6 (not traced to a
//       step; within the bound).
//   (b) every GGUF vs llama.cpp on the same file (f32 KV), two ways:
//       - vs llama.cpp on the file with every tensor decoded to F32 by gguf-py (`logits_exact`): the
//         weights are then exactly the values we decode, both sides compute in fp32, so the bounds
//         are golden_test's fp32 ones: max |Δlogit| ≤ 2e-4, NMSE ≤ 1e-9 per row, same argmax
//         (measured 2.2e-5..3.7e-5 and ≤ 1.4e-10). This proves the name/layout mapping and decode.
//       - vs llama.cpp's native path on the file (`logits`). llama.cpp rounds activations to BF16
//         (F16) before BF16 (F16) matmuls and quantizes them to Q8_0 before Q8_0/Q4_0/MXFP4 matmuls; we
//         keep fp32.
//         That noise moves logits by ~1e-2 and flips top-2-of-8 expert choices at some tokens (a
//         flipped row has NMSE ~0.5-1). The golden's metadata shows llama.cpp's own native path is
//         exactly as far from its exact decode. Measured ours-vs-native (K3 Q8_0 / Q4_0 / MXFP4
//         experts / Kimi Linear BF16): median row NMSE 3.7e-3 / 3.7e-3 / 6.3e-4 / 8.5e-5,
//         top-1 0.91 / 0.84 / 0.89 / 0.98; K3 F16 (llama.cpp rounds activations to F16 there):
//         median 2.5e-6, max 5.0e-2, top-1 1.0. Flipped rows: NMSE 0.1..0.7; 4 / 4 / 3 of 64 rows above
//         0.1 in the K3 Q8_0 / Q4_0 / MXFP4 files (worst 0.55 / 0.64 / 0.68), none in K3 F16 and Kimi
//         Linear. Bounds: median ≤ ~3-4× measured, top-1 ≥ measured − ~0.15, worst row NMSE ≤ 1.0 for
//         the K3 files with flips (a row unrelated to the reference scores ~2) and at most 8 of 64 rows
//         above 0.1 (a systematic error moves every row), ≤ 0.15 for K3 F16 and ≤ 1.2e-3 for Kimi Linear
//         (max 3.6e-4 measured), no row above 0.1 in those two.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/test_util.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/gguf_int8.h"
#include "layers/ffn.h"
#include "loader/gguf.h"
#include "loader/gguf_config.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace kestrel {
namespace {

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<float> logits;        // llama.cpp's native path on the file [n, vocab]
  std::vector<float> logits_exact;  // llama.cpp on the file's exact F32 decode (gguf-py) [n, vocab]
};

Golden read_golden(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  if (!f) throw std::runtime_error(f.error().message());
  Golden g;
  for (const auto& e : f->header().entries) {
    const TensorView v = f->view(e);
    if (e.name == "prompt") g.prompt.assign(v.as<int32_t>(), v.as<int32_t>() + v.numel());
    if (e.name == "logits") g.logits = to_f32(v);
    if (e.name == "logits_exact") g.logits_exact = to_f32(v);
  }
  return g;
}

std::string data(const std::string& f) { return std::string(KESTREL_TEST_DATA) + "/gguf/" + f; }

// All-position logits of `prompt`, prefilled in chunks of 24 (crosses KDA chunk and page edges).
// int8: GGUF Q4_0/Q8_0/MXFP4 products with Q8_0 activations (the default mode); else the exact path.
std::vector<float> run(const std::string& model, const std::vector<int32_t>& prompt, bool int8 = false, int64_t chunk = 24) {
  kernels::set_gguf_int8(int8);
  struct Restore {
    ~Restore() { kernels::set_gguf_int8(true); }
  } restore;
  auto eng = Engine::load(model);
  if (!eng) throw std::runtime_error(eng.error().message());
  SequenceState s = (*eng)->new_sequence();
  auto r = (*eng)->prefill(s, std::span<const int32_t>(prompt), chunk, true);
  if (!r) throw std::runtime_error(r.error().message());
  return *r;
}

constexpr double kFp32Order = 1e-10;  // NMSE of logits that differ only in fp32 summation order

struct Stats {
  double max_abs = 0, max_nmse = 0, median_nmse = 0, top1 = 0;
  std::vector<double> nmse;  // per row, ascending
  int64_t leading = 0;       // rows from the first on with NMSE ≤ kFp32Order, before the first that exceeds it
  double quantile(double p) const { return nmse[static_cast<size_t>(p * static_cast<double>(nmse.size() - 1))]; }
  // Rows whose NMSE exceeds `limit` (expert-flip rows sit at ~0.1..1).
  int64_t rows_above(double limit) const {
    return static_cast<int64_t>(nmse.end() - std::upper_bound(nmse.begin(), nmse.end(), limit));
  }
};

Stats compare(const std::vector<float>& got, const std::vector<float>& want, int64_t rows) {
  Stats s;
  const int64_t V = static_cast<int64_t>(want.size()) / rows;
  int64_t agree = 0;
  std::vector<double> nmse;
  for (int64_t t = 0; t < rows; ++t) {
    const float* a = got.data() + t * V;
    const float* b = want.data() + t * V;
    double num = 0, den = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double d = static_cast<double>(a[i]) - b[i];
      num += d * d, den += static_cast<double>(b[i]) * b[i];
      s.max_abs = std::max(s.max_abs, std::fabs(d));
    }
    s.max_nmse = std::max(s.max_nmse, num / den);
    nmse.push_back(num / den);
    if (s.leading == t && num / den <= kFp32Order) ++s.leading;
    agree += Sampler::argmax({a, static_cast<size_t>(V)}) == Sampler::argmax({b, static_cast<size_t>(V)});
  }
  s.top1 = static_cast<double>(agree) / static_cast<double>(rows);
  std::sort(nmse.begin(), nmse.end());
  s.median_nmse = nmse[nmse.size() / 2];
  s.nmse = std::move(nmse);
  return s;
}

struct SameModelCase {
  const char* name;
  const char* preset;
  const char* gguf;
  double max_abs;
};

class GgufVsSafetensors : public ::testing::TestWithParam<SameModelCase> {};

TEST_P(GgufVsSafetensors, SameLogits) {
  const auto& c = GetParam();
  const Golden g = read_golden(data(std::string(c.gguf) + ".logits.safetensors"));
  testing::TempDir tmp;
  testing::make_checkpoint(c.preset, tmp.path());
  const auto from_st = run(tmp.path(), g.prompt);
  const auto from_gguf = run(data(std::string(c.gguf) + ".gguf"), g.prompt);
  ASSERT_EQ(from_st.size(), from_gguf.size());
  const Stats s = compare(from_gguf, from_st, static_cast<int64_t>(g.prompt.size()));
  std::printf("[%s] GGUF vs safetensors: max |dlogit| %.3g, max NMSE %.3g, top-1 %.3f\n", c.name, s.max_abs,
              s.max_nmse, s.top1);
  EXPECT_LE(s.max_abs, c.max_abs);
  EXPECT_EQ(s.top1, 1.0);
}

INSTANTIATE_TEST_SUITE_P(Micro, GgufVsSafetensors,
                         ::testing::Values(SameModelCase{"k3_f16", "k3-micro-bf16", "k3_micro_f16", 1e-4},
                                           SameModelCase{"k3_mxfp4_experts", "k3-micro", "k3_micro_mxfp4", 1e-4},
                                           SameModelCase{"kimi_linear_bf16", "kimi-linear-micro", "kimi_linear_micro_bf16", 1e-4},
                                           SameModelCase{"deepseek_v3_bf16", "deepseek-v3-micro-bf16", "deepseek_v3_micro_bf16", 1e-4},
                                           SameModelCase{"deepseek_v3_f16", "deepseek-v3-micro-bf16", "deepseek_v3_micro_f16", 1e-4},
                                           SameModelCase{"deepseek_v2_lite_bf16", "deepseek-v2-lite-micro-bf16",
                                                         "deepseek_v2_lite_micro_bf16", 1e-4},
                                           SameModelCase{"qwen3moe_bf16", "qwen3moe-micro-bf16", "qwen3moe_micro_bf16", 1e-4}),
                         [](const auto& info) { return std::string(info.param.name); });

struct RefCase {
  const char* name;
  const char* gguf;
  // Bounds vs llama.cpp's native path (see the header comment): median-row NMSE, worst-row NMSE, rows
  // with NMSE > 0.1 and top-1 agreement over the 64 positions.
  double native_median_nmse, native_max_nmse;
  int64_t native_max_flip_rows;
  double native_min_top1;
};

class GgufVsLlamaCpp : public ::testing::TestWithParam<RefCase> {};

TEST_P(GgufVsLlamaCpp, MatchesExactDecodeTightlyAndNativePathWithinFormatNoise) {
  const auto& c = GetParam();
  const Golden g = read_golden(data(std::string(c.gguf) + ".logits.safetensors"));
  const auto got = run(data(std::string(c.gguf) + ".gguf"), g.prompt);
  ASSERT_EQ(got.size(), g.logits.size());
  ASSERT_EQ(got.size(), g.logits_exact.size());
  const auto rows = static_cast<int64_t>(g.prompt.size());
  const Stats e = compare(got, g.logits_exact, rows);
  const Stats n = compare(got, g.logits, rows);
  std::printf("[%s] vs llama.cpp on the exact F32 decode: max |dlogit| %.3g, max NMSE %.3g, top-1 %.3f\n", c.name,
              e.max_abs, e.max_nmse, e.top1);
  std::printf("[%s] vs llama.cpp native path: max |dlogit| %.3g, NMSE q25 %.3g median %.3g q90 %.3g max %.3g, "
              "rows > 0.1: %ld, top-1 %.3f\n", c.name, n.max_abs, n.quantile(0.25), n.median_nmse, n.quantile(0.9),
              n.max_nmse, static_cast<long>(n.rows_above(0.1)), n.top1);
  // Same fp32 bounds as tests/models/golden_test (summation order, llama.cpp's q/k L2-norm eps).
  EXPECT_LE(e.max_abs, 2e-4);
  EXPECT_LE(e.max_nmse, 1e-9);
  EXPECT_EQ(e.top1, 1.0);
  EXPECT_LE(n.median_nmse, c.native_median_nmse);
  EXPECT_LE(n.max_nmse, c.native_max_nmse);
  EXPECT_LE(n.rows_above(0.1), c.native_max_flip_rows);
  EXPECT_GE(n.top1, c.native_min_top1);
}

INSTANTIATE_TEST_SUITE_P(
    Micro, GgufVsLlamaCpp,
    ::testing::Values(RefCase{"k3_f16", "k3_micro_f16", 1e-5, 0.15, 0, 0.95},
                      RefCase{"k3_q8_0", "k3_micro_q8_0", 1.2e-2, 1.0, 8, 0.75},
                      RefCase{"k3_q4_0", "k3_micro_q4_0", 1.2e-2, 1.0, 8, 0.7},
                      RefCase{"k3_mxfp4_experts", "k3_micro_mxfp4", 2e-3, 1.0, 8, 0.75},
                      RefCase{"kimi_linear_bf16", "kimi_linear_micro_bf16", 3e-4, 1.2e-3, 0, 0.9},
                      RefCase{"deepseek_v3_bf16", "deepseek_v3_micro_bf16", 3e-4, 4e-3, 0, 0.9},
                      RefCase{"deepseek_v3_f16", "deepseek_v3_micro_f16", 5e-6, 3e-5, 0, 0.95},
                      RefCase{"deepseek_v3_q8_0", "deepseek_v3_micro_q8_0", 3e-3, 1.0, 8, 0.8},
                      RefCase{"deepseek_v3_q4_0", "deepseek_v3_micro_q4_0", 3e-3, 1.0, 8, 0.75},
                      // V2-Lite structure, 27 layers: llama.cpp's own native path is as far from its exact
                      // decode (median 8.7e-4 / 5.4e-3 / 4.1e-3); measured median 8.8e-4 / 5.5e-3 / 4.1e-3,
                      // worst 1.9e-2 / 0.13 / 2.4e-2, rows > 0.1: 0 / 1 / 0, top-1 0.95 / 0.92 / 0.95.
                      RefCase{"deepseek_v2_lite_bf16", "deepseek_v2_lite_micro_bf16", 3e-3, 6e-2, 0, 0.88},
                      RefCase{"deepseek_v2_lite_q8_0", "deepseek_v2_lite_micro_q8_0", 1.5e-2, 1.0, 8, 0.82},
                      RefCase{"deepseek_v2_lite_q4_0", "deepseek_v2_lite_micro_q4_0", 1.2e-2, 1.0, 8, 0.85},
                      // Qwen3-MoE structure (GQA 4 / 2 heads): measured median 2.0e-5 / 2.7e-4 / 3.3e-4, worst 5.1e-5 /
                      // 0.11 / 7.4e-2, rows > 0.1: 0 / 1 / 0, top-1 0.98 / 0.97 / 0.94 (llama.cpp's own native path
                      // against its exact decode: the same figures).
                      RefCase{"qwen3moe_bf16", "qwen3moe_micro_bf16", 6e-5, 1.5e-4, 0, 0.95},
                      RefCase{"qwen3moe_q8_0", "qwen3moe_micro_q8_0", 8e-4, 0.35, 3, 0.9},
                      RefCase{"qwen3moe_q4_0", "qwen3moe_micro_q4_0", 1e-3, 0.25, 2, 0.88},
                      // gpt-oss (GQA 8 / 2 heads, biases, sinks, 16-token window on layers 0 and 2, YaRN, MXFP4
                      // experts): measured median 5.2e-5 / 7.0e-4, worst 0.16 / 0.24, rows > 0.1: 2 / 1, top-1 0.94 /
                      // 0.95 (llama.cpp's own native path against its exact decode: the same figures).
                      RefCase{"gptoss_bf16", "gptoss_micro_bf16", 1.5e-4, 0.35, 4, 0.88},
                      RefCase{"gptoss_mxfp4", "gptoss_micro_mxfp4", 2e-3, 0.5, 3, 0.88}),
    [](const auto& info) { return std::string(info.param.name); });

// The default int8 mode (GGUF Q4_0/Q8_0/MXFP4 products with Q8_0 activations, as llama.cpp computes
// them) vs llama.cpp's native path on the same file. Both sides now quantize the activations of these
// products identically (ggml's x86 quantize_row_q8_0, checked bit for bit in ops_gguf_int8_test), so
// what remains is fp32 summation order, llama.cpp's BF16/F16 rounding of activations elsewhere, and
// the expert flips those cause. Measured (int8 mode / exact path, median row NMSE and top-1): Q8_0
// 9.9e-4 / 3.7e-3, 0.95 / 0.91; Q4_0 4.8e-4 / 3.7e-3, 0.97 / 0.84 (worst row 1.4e-2: no flip);
// MXFP4 experts in a BF16 file 1.0e-3 / 6.3e-4, 0.86 / 0.89 (there llama.cpp's BF16 rounding of the
// attention activations dominates, which neither of our modes did). Since BF16 products round their
// activations to bf16 in this mode too (bf16_dot.h): MXFP4 experts 4.5e-4 / 0.91; a BF16 Kimi Linear
// file 2.4e-5 (max 8.6e-5) / 1.00 against 8.5e-5 / 0.98 on the exact path.
// These bounds must single out the int8 mode, so the test also runs the exact path on the same file and
// requires (a) that the two modes' logits differ (max |Δ| > 1e-3: the Q8_0 rounding moves every row;
// measured 2.5 / 3.0 / 2.4 / 0.05) and (b) that the exact path MISSES the lower-quartile bound: where no
// expert flips, the int8 rows agree with llama.cpp to the rounding of the remaining fp32/bf16 steps,
// the exact path's rows keep llama.cpp's Q8_0 activation noise. Measured (2026-12-04 with the scalar
// reference kernels standing in for AVX-512 VNNI / AVX512-BF16: same integer sums and bf16 rounding,
// other fp32 summation order), int8 mode / exact path: lower-quartile NMSE Q8_0 4.7e-4 (token by
// token 5.6e-4) / 1.45e-3, Q4_0 1.4e-4 (1e-15) / 1.43e-3, MXFP4 experts 1.4e-4 (1.2e-4) / 3.1e-4,
// Kimi Linear BF16 1.65e-5 / 6.3e-5; median 9.5e-4 / 4.3e-4 / 3.6e-4 (5.1e-4) / 2.2e-5; worst row
// 0.27 / 0.010 / 0.47 / 6.9e-5; rows > 0.1: 3 / 0 / 2-3 / 0 of 64; top-1 0.97 / 0.95 / 0.89-0.91 / 1.00.
// Bounds: quartile between the two modes (≥ 1.4× from each), median ≤ ~2-3× measured, worst row
// ≤ ~2× measured, flip rows ≤ 2× measured (+2), top-1 ≥ measured − ~0.07.
struct Int8Case {
  const char* name;
  const char* gguf;
  double median_nmse, q25_nmse, max_nmse;
  int64_t max_flip_rows;  // rows with NMSE > 0.1, of 64
  double min_top1;
  bool bf16_products = false;  // the file's BF16 weights: llama.cpp's arithmetic needs bf16 activations there
};

class GgufInt8VsLlamaCpp : public ::testing::TestWithParam<Int8Case> {};

TEST_P(GgufInt8VsLlamaCpp, MatchesNativePathWithinNoise) {
  const auto& c = GetParam();
  if (!kernels::gguf_int8_applies(kernels::WeightMatrix{kernels::WeightFormat::kGgufQ8_0}))
    GTEST_SKIP() << "int8 mode needs AVX-512 VNNI or AVX2 (not active on this CPU / ISA setting)";
  // The bounds are those of both native kernels: on a CPU without AVX512-BF16 the file's BF16 products keep
  // fp32 activations (the exact path's arithmetic), so neither the int8-mode bounds nor their gap hold.
  if (c.bf16_products && !kernels::cpu_has_avx512bf16())
    GTEST_SKIP() << "the BF16 products run with bf16 activations (as llama.cpp) only on AVX512-BF16 CPUs";
  const Golden g = read_golden(data(std::string(c.gguf) + ".logits.safetensors"));
  const auto rows = static_cast<int64_t>(g.prompt.size());
  const auto int8_logits = run(data(std::string(c.gguf) + ".gguf"), g.prompt, true);
  const auto exact_logits = run(data(std::string(c.gguf) + ".gguf"), g.prompt, false);
  const Stats n = compare(int8_logits, g.logits, rows);
  const Stats x = compare(exact_logits, g.logits, rows);
  const Stats ie = compare(int8_logits, exact_logits, rows);
  std::printf("[%s] int8 mode vs llama.cpp native: max |dlogit| %.3g, NMSE q10 %.3g q25 %.3g median %.3g max %.3g, "
              "rows > 0.1: %ld, top-1 %.3f\n", c.name, n.max_abs, n.quantile(0.1), n.quantile(0.25), n.median_nmse,
              n.max_nmse, static_cast<long>(n.rows_above(0.1)), n.top1);
  std::printf("[%s] exact path vs llama.cpp native: NMSE q10 %.3g q25 %.3g median %.3g max %.3g, rows > 0.1: %ld, "
              "top-1 %.3f\n", c.name, x.quantile(0.1), x.quantile(0.25), x.median_nmse, x.max_nmse,
              static_cast<long>(x.rows_above(0.1)), x.top1);
  std::printf("[%s] int8 mode vs exact path: max |dlogit| %.3g, NMSE min %.3g median %.3g\n", c.name, ie.max_abs,
              ie.quantile(0), ie.median_nmse);
  // The int8 path really ran: its logits are not the exact path's (Q8_0 rounding of the activations
  // moves every row; fp32 reordering alone stays below 1e-4).
  EXPECT_GT(ie.max_abs, 1e-3) << "int8 mode gave the exact path's logits: the int8 kernels did not run";
  EXPECT_LE(n.median_nmse, c.median_nmse);
  EXPECT_LE(n.quantile(0.25), c.q25_nmse);
  EXPECT_LE(n.max_nmse, c.max_nmse);
  EXPECT_LE(n.rows_above(0.1), c.max_flip_rows);
  EXPECT_GE(n.top1, c.min_top1);
  // The bounds separate the modes: the exact path, whose activations are not rounded as llama.cpp
  // rounds them, misses the lower-quartile bound.
  EXPECT_GT(x.quantile(0.25), c.q25_nmse) << "the int8-mode bound is met by the exact path too";
  // One token at a time: MLA runs absorbed, with the file's k_b / v_b halves as int8 products per
  // head (what llama.cpp runs) instead of the merged kv_b: the same bounds hold. Measured (median /
  // max NMSE, top-1; with the bf16 and libmvec activation paths): Q8_0 1.0e-3 / 0.27, 0.95; Q4_0
  // 1.0e-14 / 7.5e-5, 1.00; MXFP4 experts 3.6e-4 / 0.47, 0.91; BF16 Kimi Linear 2.2e-5 / 6.9e-5, 1.00.
  const Stats d = compare(run(data(std::string(c.gguf) + ".gguf"), g.prompt, true, 1), g.logits, rows);
  std::printf("[%s] int8 mode, token by token (absorbed MLA): NMSE q10 %.3g q25 %.3g median %.3g max %.3g, "
              "rows > 0.1: %ld, top-1 %.3f\n", c.name, d.quantile(0.1), d.quantile(0.25), d.median_nmse, d.max_nmse,
              static_cast<long>(d.rows_above(0.1)), d.top1);
  EXPECT_LE(d.median_nmse, c.median_nmse);
  EXPECT_LE(d.quantile(0.25), c.q25_nmse);
  EXPECT_LE(d.max_nmse, c.max_nmse);
  EXPECT_LE(d.rows_above(0.1), c.max_flip_rows);
  EXPECT_GE(d.top1, c.min_top1);
}

INSTANTIATE_TEST_SUITE_P(Micro, GgufInt8VsLlamaCpp,
                         ::testing::Values(Int8Case{"k3_q8_0", "k3_micro_q8_0", 3e-3, 9e-4, 0.5, 6, 0.9},
                                           Int8Case{"k3_q4_0", "k3_micro_q4_0", 1.5e-3, 5e-4, 0.05, 2, 0.9},
                                           Int8Case{"k3_mxfp4_experts", "k3_micro_mxfp4", 1e-3, 2.2e-4, 0.8, 6, 0.82, true},
                                           Int8Case{"kimi_linear_bf16", "kimi_linear_micro_bf16", 7e-5, 3.5e-5, 2e-4, 0, 0.95, true},
                                           // Qwen3-MoE (AVX-512 VNNI, Zen 4, 2026-12-07), int8 mode / exact path: q25 NMSE
                                           // 3.1e-15 / 2.0e-4 (Q8_0), 0 / 2.2e-4 (Q4_0); median 3.4e-15 / 3.0e-5; worst row
                                           // 4.7e-15 / 1.3e-4; top-1 1.00 / 0.98.
                                           Int8Case{"qwen3moe_q8_0", "qwen3moe_micro_q8_0", 1e-6, 1e-6, 1e-3, 0, 0.95},
                                           Int8Case{"qwen3moe_q4_0", "qwen3moe_micro_q4_0", 1e-4, 2e-5, 5e-4, 0, 0.95},
                                           // gpt-oss (MXFP4 experts, Q8_0 elsewhere; Zen 4, 2026-12-07), int8 mode / exact
                                           // path: q10 NMSE 3.3e-15 / 3.4e-4, q25 1.3e-4 / 4.2e-4, median 2.1e-4 / 7.0e-4,
                                           // worst row 1.5e-3 / 0.24, top-1 0.94 / 0.95. The rows that differ start at ggml's
                                           // MXFP4 dot product, which converts and scales each lane's partial sums before
                                           // adding them (ours: the block's exact int32 sum, then the scales); the next
                                           // layer's Q8_0 rounding magnifies that last-bit difference.
                                           Int8Case{"gptoss_mxfp4", "gptoss_micro_mxfp4", 5e-4, 2.3e-4, 3e-3, 2, 0.87}),
                         [](const auto& info) { return std::string(info.param.name); });

// deepseek2, one token per call: every position runs MLA in the absorbed (MQA) form over the cache instead
// of the expanded form of the chunked prefill, with YaRN RoPE at each position; on the exact path the same
// fp32 bounds against llama.cpp on the exact F32 decode hold (measured max |Δlogit| 6.5e-6..7.2e-6, NMSE
// ≤ 5.2e-12). qwen3moe: each decode step attends over the rows cached by the steps before it.
class GgufTokenByToken : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufTokenByToken, AbsorbedDecodeMatchesExactDecode) {
  const Golden g = read_golden(data(std::string(GetParam()) + ".logits.safetensors"));
  const auto got = run(data(std::string(GetParam()) + ".gguf"), g.prompt, false, 1);
  ASSERT_EQ(got.size(), g.logits_exact.size());
  const Stats e = compare(got, g.logits_exact, static_cast<int64_t>(g.prompt.size()));
  std::printf("[%s] token by token vs llama.cpp on the exact F32 decode: max |dlogit| %.3g, max NMSE %.3g, top-1 %.3f\n",
              GetParam(), e.max_abs, e.max_nmse, e.top1);
  EXPECT_LE(e.max_abs, 2e-4);
  EXPECT_LE(e.max_nmse, 1e-9);
  EXPECT_EQ(e.top1, 1.0);
}

INSTANTIATE_TEST_SUITE_P(Micro, GgufTokenByToken,
                         ::testing::Values("deepseek_v3_micro_bf16", "deepseek_v3_micro_f16", "deepseek_v3_micro_q8_0",
                                           "deepseek_v3_micro_q4_0", "deepseek_v2_lite_micro_bf16",
                                           "deepseek_v2_lite_micro_q8_0", "deepseek_v2_lite_micro_q4_0",
                                           "qwen3moe_micro_bf16", "qwen3moe_micro_q8_0", "qwen3moe_micro_q4_0",
                                           "gptoss_micro_bf16", "gptoss_micro_mxfp4"));

// deepseek2 Q8_0 / Q4_0 in the default int8 mode, one token per call: the absorbed MLA runs the file's
// k_b / v_b halves in place as per-head int8 products, which is llama.cpp's deepseek2 graph (always absorbed),
// so every product quantizes the same activations the same way and the logits agree with llama.cpp's native
// path to fp32 summation order, row after row, until an int8 rounding (or a near-tied expert choice) that the
// fp32 order decides comes out the other way; from that position on the cache differs, so every later row
// does too (at the level of one int8 step, NMSE ~1e-4). The attention itself (kernels/cpu/attention.h, key
// tiles) sums in another fp32 order than llama.cpp's KQ product and soft_max. Measured: Q8_0 the first 56 of the
// 64 rows at NMSE ≤ 5e-15, then a near tie (3.4e-4) and its wake; Q4_0 the first 19 at ≤ 5e-15, then ~1e-4
// (median 1.3e-4, one near-tied expert at 0.17); top-1 1.00 / 1.00; the exact path on the same calls differs
// from the first row (q25 6e-4). Bounds: at least the first quarter of the rows at fp32 order (the exact path
// must miss it), median ≤ 1e-3, at most one row above 0.1, top-1 ≥ 0.95. (Chunked prefill runs MLA expanded
// on the merged kv_b instead, which llama.cpp never does: there the int8 mode is no nearer llama.cpp than the
// exact path, q25 1.0e-3 / 8.3e-4 vs 6.9e-4 / 6.3e-4; not asserted.)
// Not on the V2-Lite files: there the int8 mode is nearer llama.cpp than the exact path (q25 1.7e-4 / 6.3e-4
// vs 3.5e-3 / 2.5e-3, Q8_0 / Q4_0) but not to fp32 order; the step that differs is not found yet.
class GgufDeepseek2Int8TokenByToken : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufDeepseek2Int8TokenByToken, AbsorbedInt8MatchesLlamaCppNative) {
  if (!kernels::gguf_int8_applies(kernels::WeightMatrix{kernels::WeightFormat::kGgufQ8_0}))
    GTEST_SKIP() << "int8 mode needs AVX-512 VNNI or AVX2 (not active on this CPU / ISA setting)";
  const Golden g = read_golden(data(std::string(GetParam()) + ".logits.safetensors"));
  const auto rows = static_cast<int64_t>(g.prompt.size());
  const Stats n = compare(run(data(std::string(GetParam()) + ".gguf"), g.prompt, true, 1), g.logits, rows);
  const Stats x = compare(run(data(std::string(GetParam()) + ".gguf"), g.prompt, false, 1), g.logits, rows);
  std::printf("[%s] int8 mode token by token vs llama.cpp native: the first %ld of %ld rows at fp32 order, NMSE "
              "q25 %.3g median %.3g max %.3g, top-1 %.3f; exact path: first %ld rows, q25 %.3g\n",
              GetParam(), static_cast<long>(n.leading), static_cast<long>(rows), n.quantile(0.25), n.median_nmse,
              n.max_nmse, n.top1, static_cast<long>(x.leading), x.quantile(0.25));
  EXPECT_GE(n.leading, rows / 4);
  EXPECT_LE(n.median_nmse, 1e-3);
  EXPECT_LE(n.rows_above(0.1), 1);
  EXPECT_GE(n.top1, 0.95);
  EXPECT_LT(x.leading, rows / 4) << "the exact path meets the int8-mode bound too";
}

INSTANTIATE_TEST_SUITE_P(Micro, GgufDeepseek2Int8TokenByToken,
                         ::testing::Values("deepseek_v3_micro_q8_0", "deepseek_v3_micro_q4_0"));

// The MoE experts in one parallel region (layers/moe_fused.cpp) against the grouped matmul_many path, int8
// mode, bit for bit: prefill chunks of 64 tokens (routed experts with 16 or more tokens in the GEMM form too),
// of 24 tokens (the shared experts in the GEMM form, several tokens per expert) and one token at a time.
// The files cover Q4_0 and Q8_0 experts with shared experts, LatentMoE
// (the routed input is the latent, the shared experts' the hidden state: two quantized inputs) and
// deepseek2's plain MoE.
class GgufMoeFused : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufMoeFused, SameBitsAsGroupedExperts) {
  if (!kernels::gguf_int8_applies(kernels::WeightMatrix{kernels::WeightFormat::kGgufQ8_0}))
    GTEST_SKIP() << "GGUF int8 mode needs AVX-512 VNNI or AVX2";
  const Golden g = read_golden(data(std::string(GetParam()) + ".logits.safetensors"));
  struct Restore {
    ~Restore() { set_moe_fused(true); }
  } restore;
  for (const int64_t chunk : {64, 24, 1}) {  // 64: routed experts with ≥ 16 tokens take the GEMM form
    SCOPED_TRACE(chunk);
    set_moe_fused(false);
    const auto grouped = run(data(std::string(GetParam()) + ".gguf"), g.prompt, true, chunk);
    set_moe_fused(true);
    const auto fused = run(data(std::string(GetParam()) + ".gguf"), g.prompt, true, chunk);
    ASSERT_EQ(fused.size(), grouped.size());
    EXPECT_EQ(std::memcmp(fused.data(), grouped.data(), fused.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Micro, GgufMoeFused,
                         ::testing::Values("k3_micro_q4_0", "k3_micro_q8_0", "deepseek_v3_micro_q4_0",
                                           "deepseek_v3_micro_q8_0", "deepseek_v2_lite_micro_q4_0", "qwen3moe_micro_q4_0", "gptoss_micro_mxfp4"));

// deepseek2 metadata (llama.cpp's converter) → the same ModelConfig as the checkpoint's config.json it was
// converted from: every field the DeepSeek model reads, the derived softmax scale bit for bit (YaRN mscale
// from yarn_log_multiplier / 0.1 in float, as llama.cpp undoes it).
// DeepSeek-V2-Lite's mscale 0.707 comes back as float(0.1·0.707) / 0.1f, 1 ulp of float from 0.707 (V3's
// 1.0 exactly): there mscale and the softmax scale are bounded by 2 float ulps instead.
struct MetaCase {
  const char* preset;
  const char* gguf;
  double mscale_rel_tol;
};

class GgufDeepseek2Metadata : public ::testing::TestWithParam<MetaCase> {};

TEST_P(GgufDeepseek2Metadata, GivesTheCheckpointsConfig) {
  const MetaCase& c = GetParam();
  testing::TempDir tmp;
  testing::make_checkpoint(c.preset, tmp.path());
  auto want = load_model_config(tmp.path());
  ASSERT_TRUE(want) << want.error().message();
  auto f = GgufFile::open(data(c.gguf));
  ASSERT_TRUE(f) << f.error().message();
  auto got = model_config_from_gguf(f->header(), c.gguf);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->arch, Arch::kDeepseekV3);
  const TextConfig &a = got->text, &b = want->text;
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.first_k_dense_replace, b.first_k_dense_replace);
  EXPECT_EQ(a.ffn_kind, b.ffn_kind);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_token, b.num_experts_per_token);
  EXPECT_EQ(a.num_shared_experts, b.num_shared_experts);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.moe_renormalize, b.moe_renormalize);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.num_expert_group, b.num_expert_group);
  EXPECT_EQ(a.topk_group, b.topk_group);
  EXPECT_EQ(a.router_scoring, b.router_scoring);
  EXPECT_EQ(a.router_bias, b.router_bias);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  const auto near = [&](double x, double y) { return std::abs(x - y) <= c.mscale_rel_tol * std::abs(y); };
  EXPECT_PRED2(near, a.mla_softmax_scale, b.mla_softmax_scale);
  ASSERT_TRUE(a.mla_rope && b.mla_rope);
  EXPECT_EQ(a.mla_rope->theta, b.mla_rope->theta);
  EXPECT_TRUE(a.mla_rope->yarn && b.mla_rope->yarn);
  EXPECT_EQ(a.mla_rope->factor, b.mla_rope->factor);
  EXPECT_EQ(a.mla_rope->beta_fast, b.mla_rope->beta_fast);
  EXPECT_EQ(a.mla_rope->beta_slow, b.mla_rope->beta_slow);
  EXPECT_PRED2(near, a.mla_rope->mscale, b.mla_rope->mscale);
  EXPECT_PRED2(near, a.mla_rope->mscale_all_dim, b.mla_rope->mscale_all_dim);
  EXPECT_EQ(a.mla_rope->original_max_position_embeddings, b.mla_rope->original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
}

INSTANTIATE_TEST_SUITE_P(Micro, GgufDeepseek2Metadata,
                         ::testing::Values(MetaCase{"deepseek-v3-micro-bf16", "deepseek_v3_micro_bf16.gguf", 0.0},
                                           MetaCase{"deepseek-v2-lite-micro-bf16", "deepseek_v2_lite_micro_bf16.gguf",
                                                    2.4e-7}));

// The fields every grouped-query-attention MoE config has, read from GGUF metadata (a) and from the checkpoint's
// config.json (b).
void expect_same_gqa_moe_fields(const TextConfig& a, const TextConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.gqa_rope.theta, b.gqa_rope.theta);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.attn_kind, b.attn_kind);
  EXPECT_EQ(a.ffn_kind, b.ffn_kind);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_token, b.num_experts_per_token);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.moe_renormalize, b.moe_renormalize);
  EXPECT_EQ(a.router_scoring, b.router_scoring);
  EXPECT_EQ(a.router_bias, b.router_bias);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
}

// qwen3moe metadata (llama.cpp's converter) → the same ModelConfig as the config.json it was converted from.
TEST(GgufQwen3moe, MetadataGivesTheCheckpointsConfig) {
  testing::TempDir tmp;
  testing::make_checkpoint("qwen3moe-micro-bf16", tmp.path());
  auto want = load_model_config(tmp.path());
  ASSERT_TRUE(want) << want.error().message();
  auto f = GgufFile::open(data("qwen3moe_micro_bf16.gguf"));
  ASSERT_TRUE(f) << f.error().message();
  auto got = model_config_from_gguf(f->header(), "qwen3moe_micro_bf16.gguf");
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->arch, Arch::kQwen3Moe);
  const TextConfig &a = got->text, &b = want->text;
  expect_same_gqa_moe_fields(a, b);
}

// gpt-oss metadata (llama.cpp's converter) → the same ModelConfig as the config.json it was converted from
// (tools/gen_gptoss_goldens.py keeps that file; its YaRN says truncate: true, what llama.cpp always does).
TEST(GgufGptOss, MetadataGivesTheCheckpointsConfig) {
  std::ifstream in(data("gptoss_micro.config.json"));
  ASSERT_TRUE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  auto want = parse_model_config(ss.str(), "gptoss_micro.config.json");
  ASSERT_TRUE(want) << want.error().message();
  auto f = GgufFile::open(data("gptoss_micro_mxfp4.gguf"));
  ASSERT_TRUE(f) << f.error().message();
  auto got = model_config_from_gguf(f->header(), "gptoss_micro_mxfp4.gguf");
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->arch, Arch::kGptOss);
  EXPECT_EQ(want->arch, Arch::kGptOss);
  const TextConfig &a = got->text, &b = want->text;
  expect_same_gqa_moe_fields(a, b);
  EXPECT_TRUE(a.gqa_rope.yarn && b.gqa_rope.yarn);
  EXPECT_EQ(a.gqa_rope.factor, b.gqa_rope.factor);
  EXPECT_EQ(a.gqa_rope.beta_fast, b.gqa_rope.beta_fast);
  EXPECT_EQ(a.gqa_rope.beta_slow, b.gqa_rope.beta_slow);
  EXPECT_EQ(a.gqa_rope.original_max_position_embeddings, b.gqa_rope.original_max_position_embeddings);
  EXPECT_TRUE(a.gqa_rope.truncate && b.gqa_rope.truncate);
  EXPECT_EQ(a.gqa_window, (std::vector<int>{16, 0, 16}));
  EXPECT_EQ(a.gqa_window, b.gqa_window);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_TRUE(a.attn_sinks && b.attn_sinks);
  EXPECT_EQ(a.hidden_act, Activation::kSwiGluOai);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.swiglu_alpha, b.swiglu_alpha);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_TRUE(a.router_logit_bias && b.router_logit_bias && a.expert_bias && b.expert_bias);
  EXPECT_FALSE(a.experts_mxfp4);  // GGUF MXFP4 runs through the GGUF int8 kernels, not the W4A8 form
}

// DeepSeek-V2-Lite files: what llama.cpp reads the same way is accepted as the same model (no
// expert_gating_func = softmax; q_lora_rank 0 = none); softmax with groups is DeepSeek V2's
// group_limited_greedy; what is not built is refused naming the key.
TEST(GgufDeepseek2, V2LiteVariantsAcceptedOrRefusedNamingTheKey) {
  auto f = GgufFile::open(data("deepseek_v2_lite_micro_q8_0.gguf"));
  ASSERT_TRUE(f) << f.error().message();
  auto base = model_config_from_gguf(f->header(), "f.gguf");
  ASSERT_TRUE(base) << base.error().message();
  EXPECT_EQ(base->text.q_lora_rank, 0);
  EXPECT_EQ(base->text.router_scoring, RouterScoring::kSoftmax);
  EXPECT_FALSE(base->text.router_bias);
  const auto u32 = [](uint64_t v) {
    GgufValue x;
    x.type = GgufType::kU32;
    x.raw = {v};
    return x;
  };
  auto edited = [&](const std::function<void(GgufHeader&)>& edit) {
    GgufHeader h = f->header();
    edit(h);
    return model_config_from_gguf(h, "f.gguf");
  };
  const std::string g = "deepseek2.expert_gating_func";
  for (const auto& edit : std::vector<std::function<void(GgufHeader&)>>{
           [&](GgufHeader& h) { h.kv.erase(g); },  // DeepSeek V2 files before the key: llama.cpp reads softmax
           [&](GgufHeader& h) { h.kv.insert_or_assign("deepseek2.attention.q_lora_rank", u32(0)); }}) {
    auto c = edited(edit);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->text.router_scoring, RouterScoring::kSoftmax);
    EXPECT_EQ(c->text.q_lora_rank, 0);
    EXPECT_EQ(c->text.mla_softmax_scale, base->text.mla_softmax_scale);
  }
  auto grouped = edited([&](GgufHeader& h) {  // DeepSeek V2 (236B) routes over groups
    h.kv.insert_or_assign("deepseek2.expert_group_count", u32(4));
    h.kv.insert_or_assign("deepseek2.expert_group_used_count", u32(2));
  });
  ASSERT_TRUE(grouped) << grouped.error().message();
  EXPECT_EQ(grouped->text.num_expert_group, 4);
  EXPECT_EQ(grouped->text.topk_group, 2);
  EXPECT_FALSE(grouped->text.router_bias);
  auto refused = [&](const std::function<void(GgufHeader&)>& edit, const std::string& key) {
    auto c = edited(edit);
    ASSERT_FALSE(c) << "accepted after editing " << key;
    const std::string m = c.error().message();
    EXPECT_NE(m.find("f.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find(key), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  refused([&](GgufHeader& h) { h.kv.at(g) = u32(2); }, g);  // sigmoid without exp_probs_b
  refused([&](GgufHeader& h) { h.kv.at(g) = u32(3); }, g);  // llama.cpp's sqrt-softplus: not DeepSeek's
  refused([](GgufHeader& h) {  // neither q_lora nor attn_q
    std::erase_if(h.tensors, [](const auto& t) { return t.name.find(".attn_q.") != std::string::npos; });
  }, "deepseek2.attention.q_lora_rank");
  refused([](GgufHeader& h) {  // softmax with the V3 correction bias: a tensor renamed to exp_probs_b
    for (auto& t : h.tensors)
      if (t.name == "blk.1.ffn_norm.weight") t.name = "blk.1.exp_probs_b.bias";
  }, g);
}

// What the DeepSeek model does not build is refused with one line naming the key.
TEST(GgufDeepseek2, UnsupportedMetadataIsRefusedNamingTheKey) {
  auto f = GgufFile::open(data("deepseek_v3_micro_q8_0.gguf"));
  ASSERT_TRUE(f) << f.error().message();
  ASSERT_TRUE(model_config_from_gguf(f->header(), "f.gguf"));
  auto refused = [&](const std::function<void(GgufHeader&)>& edit, const std::string& key) {
    GgufHeader h = f->header();
    edit(h);
    auto c = model_config_from_gguf(h, "f.gguf");
    ASSERT_FALSE(c) << "accepted after editing " << key;
    const std::string m = c.error().message();
    EXPECT_NE(m.find("f.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find(key), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  const std::string g = "deepseek2.expert_gating_func";
  refused([&](GgufHeader& h) { h.kv.erase(g); }, g);  // llama.cpp: absent = softmax (V2)
  refused([&](GgufHeader& h) { h.kv.at(g) = h.kv.at("deepseek2.expert_shared_count"); }, g);  // 1 = softmax
  refused([](GgufHeader& h) { std::erase_if(h.tensors, [](const auto& t) { return t.name.find("exp_probs_b") != std::string::npos; }); },
          "exp_probs_b");
  for (const char* k : {"deepseek2.attention.key_length_mla", "deepseek2.attention.q_lora_rank",
                        "deepseek2.rope.scaling.yarn_log_multiplier", "deepseek2.expert_count",
                        "deepseek2.attention.kv_lora_rank"})
    refused([&](GgufHeader& h) { h.kv.erase(k); }, k);
  refused([](GgufHeader& h) { h.kv.at("deepseek2.rope.scaling.type") = h.kv.at("general.architecture"); },
          "deepseek2.rope.scaling.type");
  refused([](GgufHeader& h) {  // 2.5: a YaRN attention factor the converter never writes for these models
    h.kv.insert_or_assign("deepseek2.rope.scaling.yarn_attn_factor", h.kv.at("deepseek2.expert_weights_scale"));
  }, "deepseek2.rope.scaling.yarn_attn_factor");
}

// Corrupted converter files: one line naming the file and the tensor, never a crash.
class GgufCorrupt : public ::testing::Test {
 protected:
  // Copies `file` into the temp dir and returns the path and bytes.
  std::string copy(const std::string& file) {
    path_ = tmp_.sub(file);
    bytes_ = testing::read_bytes(data(file));
    return path_;
  }
  // Offset of the tensor-info type field of `name` (name string, n_dims, dims, type).
  size_t type_field(const std::string& name) {
    const std::string needle = name;
    for (size_t i = 8; i + needle.size() < bytes_.size(); ++i) {
      uint64_t len;
      std::memcpy(&len, &bytes_[i - 8], 8);
      if (len == needle.size() && std::memcmp(&bytes_[i], needle.data(), needle.size()) == 0) {
        uint32_t nd;
        std::memcpy(&nd, &bytes_[i + needle.size()], 4);
        return i + needle.size() + 4 + 8 * nd;
      }
    }
    throw std::runtime_error("tensor not found: " + name);
  }
  std::string load_error() {
    testing::write_bytes(path_, bytes_);
    auto e = Engine::load(path_);
    return e ? std::string() : e.error().message();
  }
  void expect_one_line(const std::string& m, const std::vector<std::string>& parts) {
    ASSERT_FALSE(m.empty()) << "corrupt file loaded";
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(path_), std::string::npos) << m;
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
  testing::TempDir tmp_;
  std::string path_;
  std::vector<uint8_t> bytes_;
};

TEST_F(GgufCorrupt, GoodCopyLoads) {
  copy("k3_micro_q4_0.gguf");
  EXPECT_EQ(load_error(), "");
}

TEST_F(GgufCorrupt, RenamedTensorIsMissingAndUnused) {
  copy("k3_micro_q8_0.gguf");
  const size_t t = type_field("blk.0.attn_q.weight");
  bytes_[t - 4 - 8 * 2 - 8] = 'X';  // "blk.0.attn_q.weight" → "blk.0.attn_X.weight"
  expect_one_line(load_error(), {"blk.0.attn_q.weight", "not found"});
}

TEST_F(GgufCorrupt, UnsupportedQuantType) {
  copy("k3_micro_q4_0.gguf");
  const size_t t = type_field("blk.0.attn_q.weight");
  ASSERT_EQ(bytes_[t], 2);  // Q4_0
  bytes_[t] = 20;           // IQ4_NL: same block geometry, not supported by the engine
  expect_one_line(load_error(), {"blk.0.attn_q.weight", "IQ4_NL is not supported"});
}

TEST_F(GgufCorrupt, QuantizedWhereFloatNeeded) {
  copy("k3_micro_q8_0.gguf");
  const size_t t = type_field("output_norm.weight");
  ASSERT_EQ(bytes_[t], 0);  // F32
  bytes_[t] = 26;           // I32
  expect_one_line(load_error(), {"output_norm.weight", "I32"});
}

TEST_F(GgufCorrupt, WrongShape) {
  copy("k3_micro_q8_0.gguf");
  const size_t t = type_field("blk.1.ssm_norm.weight");  // ne [64] → [32, 2]: same bytes, wrong shape
  uint64_t ne0;
  std::memcpy(&ne0, &bytes_[t - 8], 8);
  ASSERT_EQ(ne0, 64u);
  // Rewriting n_dims would shift the header; ne[0] = 32 keeps the file valid (half the bytes: still in
  // bounds, no overlap), so only the binder's shape check can catch it.
  ne0 = 32;
  std::memcpy(&bytes_[t - 8], &ne0, 8);
  expect_one_line(load_error(), {"blk.1.ssm_norm.weight", "[32]", "[64]"});
}

TEST_F(GgufCorrupt, Truncated) {
  copy("kimi_linear_micro_bf16.gguf");
  bytes_.resize(bytes_.size() / 2);
  expect_one_line(load_error(), {"past end of file"});
}

TEST_F(GgufCorrupt, NotGguf) {
  copy("k3_micro_q4_0.gguf");
  bytes_[0] = 'X';
  expect_one_line(load_error(), {"not a GGUF file"});
}

}  // namespace
}  // namespace kestrel
