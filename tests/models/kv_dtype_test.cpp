// The MLA latent cache dtype (--kv-cache-dtype) on whole tiny models — K3 (NoPE MLA beside KDA), DeepSeek V3
// (dense MLA with RoPE) and DeepSeek V3.2 (the sparse MLA kernel; top-256, which keeps every position of these
// runs, and top-8, really sparse): every dtype runs a generation; fp32 is the
// default; bf16 and fp8 logits stay within a stated bound of fp32 over a greedy run (teacher-forced on the
// fp32 tokens so every step compares the same context), and the bound is tight enough that a broken
// dequantize (zeroed rows, rows read at twice their value) fails it. The measured numbers are in
// docs/architecture.md ("MLA cache dtype").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "common/test_util.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace kestrel {
namespace {

constexpr int kPrompt = 40, kGen = 24;

struct Case {
  const char* preset;
  KvCacheDtype dtype;
  // Bound on the median over the run's steps of max |logit − fp32 logit| / max |fp32 logit| (measured: docs), and
  // the fewest steps whose argmax must equal fp32's (of kGen + 1).
  double median_bound;
  int min_top1;
};

struct Drift {
  double median = 0;   // median over steps of (max |Δ logit| / max |fp32 logit|)
  double max = 0;      // max over steps of the same
  double abs = 0;      // max |Δ logit|
  int top1_same = 0;   // steps whose argmax equals fp32's
};

using Corrupt = std::function<void(SequenceState&)>;

// Prefill a fixed prompt (one chunk: the expanded MLA form on dense layers), then kGen decode steps (absorbed
// form). Greedy when `forced` is empty, else fed those tokens. `corrupt` runs after the prefill.
std::vector<std::vector<float>> run(Engine& e, KvCacheDtype d, const std::vector<int32_t>& forced,
                                    std::vector<int32_t>* tokens, const Corrupt& corrupt = nullptr,
                                    std::vector<int32_t> ids = {}, int gen = kGen) {
  const int vocab = e.config().text.vocab_size;
  if (ids.empty())
    for (int i = 0; i < kPrompt; ++i) ids.push_back((i * 131 + 7) % vocab);
  SequenceState s = e.new_sequence(d);
  auto l = e.prefill(s, ids, 0);
  EXPECT_TRUE(l);
  if (!l) return {};
  if (corrupt) corrupt(s);
  std::vector<std::vector<float>> out{*l};
  for (int i = 0; i < gen; ++i) {
    const int32_t tok = forced.empty() ? Sampler::argmax(out.back()) : forced[static_cast<size_t>(i)];
    if (tokens) tokens->push_back(tok);
    auto n = e.decode(s, tok);
    EXPECT_TRUE(n);
    if (!n) return {};
    out.push_back(*n);
  }
  return out;
}

// Per step: the largest logit difference relative to the run's largest fp32 logit. The median is the bounded
// figure: the tiny models route (MoE top-k, DSA top-k) by comparisons that a small perturbation can flip now
// and then, which makes single steps jump (the max, reported too).
Drift drift(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref) {
  Drift d;
  double scale = 0;
  for (const auto& r : ref)
    for (float v : r) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  std::vector<double> steps;
  for (size_t s = 0; s < ref.size(); ++s) {
    double m = 0;
    for (size_t i = 0; i < ref[s].size(); ++i) m = std::max(m, static_cast<double>(std::fabs(got[s][i] - ref[s][i])));
    d.abs = std::max(d.abs, m);
    steps.push_back(m / scale);
    d.top1_same += Sampler::argmax(got[s]) == Sampler::argmax(ref[s]) ? 1 : 0;
  }
  d.max = *std::max_element(steps.begin(), steps.end());
  std::nth_element(steps.begin(), steps.begin() + static_cast<long>(steps.size() / 2), steps.end());
  d.median = steps[steps.size() / 2];
  return d;
}

// Every cached MLA row of every layer replaced by f(decoded row), re-stored in the sequence's dtype.
Corrupt rows(const std::function<void(std::vector<float>&)>& f) {
  return [f](SequenceState& s) {
    for (MlaCache& m : s.mla) {
      std::vector<float> r(static_cast<size_t>(m.row.elems()));
      for (int64_t j = 0; j < m.n_tokens; ++j) {
        kernels::kv_load_row(m.row, m.row_ptr(j), m.row.elems(), r.data());
        f(r);
        kernels::kv_store_row(m.row, r.data(), m.row_ptr(j));
      }
    }
  };
}

class KvCacheDtypeModels : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    testing::make_checkpoint(GetParam().preset, dir_.path());
    auto e = Engine::load(dir_.path());
    ASSERT_TRUE(e) << e.error().message();
    eng_ = std::move(*e);
  }
  testing::TempDir dir_;
  std::unique_ptr<Engine> eng_;
};

TEST_P(KvCacheDtypeModels, LogitsWithinTheStatedBoundOfFp32) {
  const Case& c = GetParam();
  std::vector<int32_t> greedy32;
  const auto ref = run(*eng_, KvCacheDtype::kF32, {}, &greedy32);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kGen + 1));
  // The default sequence is fp32.
  EXPECT_EQ(run(*eng_, KvCacheDtype::kF32, greedy32, nullptr), (run(*eng_, KvCacheDtype{}, greedy32, nullptr)));

  const Drift d = drift(run(*eng_, c.dtype, greedy32, nullptr), ref);
  std::vector<int32_t> greedy;
  run(*eng_, c.dtype, {}, &greedy);  // a free greedy generation in this dtype
  const auto diverge = std::mismatch(greedy.begin(), greedy.end(), greedy32.begin()).first - greedy.begin();
  const std::string name = std::string(c.preset) + " " + std::string(kv_cache_dtype_name(c.dtype));
  std::printf("[ %s ] relative logit drift median %.2g max %.2g (max |dlogit| %.3g), top-1 agreement %d/%d, free greedy "
              "run equal to fp32 for %td/%d tokens\n",
              name.c_str(), d.median, d.max, d.abs, d.top1_same, kGen + 1, diverge, kGen);
  EXPECT_LE(d.median, c.median_bound) << name;
  EXPECT_GT(d.max, 0.0) << name << ": the dtype really is lossy";
  EXPECT_GE(d.top1_same, c.min_top1) << name;

  // A broken dequantize fails the bound: rows read as zero, rows read at twice their value.
  const Drift zeroed = drift(run(*eng_, c.dtype, greedy32, nullptr, rows([](auto& r) { std::fill(r.begin(), r.end(), 0.0f); })), ref);
  const Drift doubled = drift(run(*eng_, c.dtype, greedy32, nullptr, rows([](auto& r) { for (auto& v : r) v *= 2; })), ref);
  std::printf("[ %s ] broken rows: zeroed median %.2g, doubled median %.2g\n", name.c_str(), zeroed.median, doubled.median);
  EXPECT_GT(zeroed.median, c.median_bound) << name;
  EXPECT_GT(doubled.median, c.median_bound) << name;
}

// The shipped trained default model (K3 architecture; models/default): a text prompt and 64 greedy tokens. Its
// distributions are peaked, so neither lossy dtype changes a greedy token and the drift is far below the random
// tiny models'. Bounds about 3× the measured max |Δ logit| (docs), below what zeroed rows give.
TEST(KvCacheDtypeShippedModel, GreedyTokensEqualFp32) {
  auto e = Engine::load(KESTREL_DEFAULT_MODEL_DIR);
  ASSERT_TRUE(e) << e.error().message();
  // "Once upon a time, in a small village by the sea, there lived an old fisherman who" in the model's tokenizer.
  const std::vector<int32_t> prompt = {3358, 339, 3604, 265, 776, 44, 298, 265, 620, 375, 421, 469, 366,
                                       281, 2457, 44, 1364, 315, 1500, 299, 2409, 1310, 765, 256, 468};
  constexpr int kShippedGen = 64;
  std::vector<int32_t> greedy32;
  const auto ref = run(**e, KvCacheDtype::kF32, {}, &greedy32, nullptr, prompt, kShippedGen);
  for (auto [d, bound] : {std::pair{KvCacheDtype::kBF16, 0.004}, std::pair{KvCacheDtype::kFP8, 1.2}}) {
    const std::string name = std::string(kv_cache_dtype_name(d));
    std::vector<int32_t> greedy;
    const Drift dr = drift(run(**e, d, {}, &greedy, nullptr, prompt, kShippedGen), ref);
    EXPECT_EQ(greedy, greedy32) << name;
    const Drift zeroed = drift(run(**e, d, greedy32, nullptr, rows([](auto& r) { std::fill(r.begin(), r.end(), 0.0f); }),
                                   prompt, kShippedGen), ref);
    std::printf("[ shipped model %s ] relative logit drift median %.2g max %.2g (max |dlogit| %.3g), top-1 %d/%d; zeroed "
                "rows: median %.2g, max |dlogit| %.3g\n",
                name.c_str(), dr.median, dr.max, dr.abs, dr.top1_same, kShippedGen + 1, zeroed.median, zeroed.abs);
    EXPECT_LE(dr.abs, bound) << name;
    EXPECT_GT(zeroed.abs, bound) << name;
  }
}

// Bounds: about twice the measured median (docs/architecture.md), far below the broken rows' medians.
std::vector<Case> cases() {
  return {
      {"k3-tiny", KvCacheDtype::kBF16, 0.002, 24},
      {"k3-tiny", KvCacheDtype::kFP8, 0.02, 20},
      {"deepseek-v3-tiny", KvCacheDtype::kBF16, 0.01, 24},
      {"deepseek-v3-tiny", KvCacheDtype::kFP8, 0.15, 18},
      {"deepseek-v32-tiny", KvCacheDtype::kBF16, 0.04, 20},
      {"deepseek-v32-tiny", KvCacheDtype::kFP8, 0.25, 10},
      {"deepseek-v32-sparse-tiny", KvCacheDtype::kBF16, 0.5, 10},
      {"deepseek-v32-sparse-tiny", KvCacheDtype::kFP8, 0.6, 5},
  };
}

INSTANTIATE_TEST_SUITE_P(Tiny, KvCacheDtypeModels, ::testing::ValuesIn(cases()), [](const auto& i) {
  std::string n = std::string(i.param.preset) + "_" + std::string(kv_cache_dtype_name(i.param.dtype));
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

}  // namespace
}  // namespace kestrel
