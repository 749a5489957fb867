// Sampling: greedy, temperature, top-k / top-p / min-p restrict the support, a seed reproduces, and the
// draws follow softmax(logits / T) renormalised over the kept set (chi-square on 20,000 seeded draws per
// case, with and without penalties from scheduler/logits_processor).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "scheduler/logits_processor.h"

namespace kestrel {
namespace {

std::vector<float> logits() { return {0.1f, 2.0f, 1.9f, -1.0f, 0.5f, 1.0f, -3.0f, 1.8f}; }

std::set<int32_t> support(const SamplingParams& p, int draws = 4000) {
  Sampler s(p);
  std::set<int32_t> seen;
  const auto l = logits();
  for (int i = 0; i < draws; ++i) seen.insert(s.sample(l));
  return seen;
}

TEST(Sampler, GreedyIsArgmax) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits()), 1);
  SamplingParams k1{1.0f, 1, 1.0f, 0.0f, 5};
  EXPECT_EQ(Sampler(k1).sample(logits()), 1);
}

TEST(Sampler, SeedReproducesAndDiffers) {
  SamplingParams p{1.0f, 0, 1.0f, 0.0f, 42};
  Sampler a(p), b(p);
  std::vector<int32_t> x, y;
  for (int i = 0; i < 200; ++i) x.push_back(a.sample(logits())), y.push_back(b.sample(logits()));
  EXPECT_EQ(x, y);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> z;
  for (int i = 0; i < 200; ++i) z.push_back(c.sample(logits()));
  EXPECT_NE(x, z);
}

TEST(Sampler, TopKTopPMinPRestrictSupport) {
  EXPECT_EQ(support({1.0f, 3, 1.0f, 0.0f, 1}), (std::set<int32_t>{1, 2, 7}));
  // Probabilities at T=1: id 1 .284, id 2 .257, id 7 .233, id 5 .104, ...; top_p 0.5 stops once the
  // cumulative mass reaches 0.5 (after id 2).
  EXPECT_EQ(support({1.0f, 0, 0.5f, 0.0f, 2}), (std::set<int32_t>{1, 2}));
  // min_p 0.5: keep p >= 0.5 * 0.284 = 0.142 → ids 1, 2, 7.
  EXPECT_EQ(support({1.0f, 0, 1.0f, 0.5f, 3}), (std::set<int32_t>{1, 2, 7}));
  EXPECT_EQ(support({1.0f, 0, 1.0f, 0.0f, 4}).size(), 8u);
}

TEST(Sampler, TemperatureSharpens) {
  int hits_cold = 0, hits_hot = 0;
  Sampler cold(SamplingParams{0.05f, 0, 1.0f, 0.0f, 9}), hot(SamplingParams{5.0f, 0, 1.0f, 0.0f, 9});
  for (int i = 0; i < 2000; ++i) hits_cold += cold.sample(logits()) == 1, hits_hot += hot.sample(logits()) == 1;
  EXPECT_GT(hits_cold, 1600);  // p(id 1) = 0.867 at T = 0.05
  EXPECT_LT(hits_hot, 600);  // ~0.17 at T = 5
}

// ---------------------------------------------------------------------------------------------------
// Distribution tests: the empirical frequencies of many seeded draws against the distribution the
// documented rule gives, computed here independently in double precision:
//   p = softmax(logits / T) over all ids, ids ranked by p (descending; the logits below are distinct);
//   top-k keeps the k most probable and renormalises; top-p then keeps the smallest prefix (of that
//   renormalised ranking) whose cumulative probability is >= top_p; min-p keeps p >= min_p · p_max
//   (a ratio, so it does not matter which renormalisation it sees); the draw is proportional to p over
//   the kept ids. Same order as the sampler header (temperature → top-k → top-p → min-p).
// Pearson's chi-square over the kept ids must stay below kChi2Max (df <= 9: P(chi² > 40 | correct) < 1e-5,
// and the fixed seed makes it deterministic), and ids outside the kept set must never appear. Every case
// also checks its own power: a sampler drawing UNIFORMLY over the kept set (and, for T != 1, one that
// ignores the temperature) would have an expected chi-square >= 10 × kChi2Max on the same draws.

constexpr int kDraws = 20000;
constexpr double kChi2Max = 40.0;

// Distinct logits, not sorted by id; probabilities at T = 1 from 0.309 (id 2) down to 0.007 (id 5).
std::vector<float> dist_logits() { return {1.2f, -0.4f, 2.3f, 0.1f, 1.7f, -1.5f, 0.8f, 2.0f, -0.9f, 0.4f}; }

// The expected distribution (0 outside the kept set). Fails the test when top_p or min_p sits within
// 1e-3 of a boundary, where float rounding inside the sampler could legitimately flip membership.
std::vector<double> expected_dist(const std::vector<float>& logits, const SamplingParams& sp) {
  const size_t V = logits.size();
  std::vector<double> p(V);
  double mx = -1e300, z = 0;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l) / sp.temperature);
  for (size_t i = 0; i < V; ++i) z += p[i] = std::exp(static_cast<double>(logits[i]) / sp.temperature - mx);
  for (double& v : p) v /= z;
  std::vector<size_t> order(V);
  for (size_t i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  size_t keep = V;
  if (sp.top_k > 0) keep = std::min(keep, static_cast<size_t>(sp.top_k));
  double mass = 0;
  for (size_t r = 0; r < keep; ++r) mass += p[order[r]];
  if (sp.top_p < 1.0f) {
    double cum = 0;
    for (size_t r = 0; r < keep; ++r) {
      cum += p[order[r]] / mass;
      EXPECT_GT(std::fabs(cum - sp.top_p), 1e-3) << "top_p " << sp.top_p << " is on a boundary";
      if (cum >= sp.top_p) { keep = r + 1; break; }
    }
  }
  if (sp.min_p > 0.0f) {
    const double pmax = p[order[0]];
    size_t r = 1;
    for (; r < keep; ++r) {
      EXPECT_GT(std::fabs(p[order[r]] / pmax - sp.min_p), 1e-3) << "min_p " << sp.min_p << " is on a boundary";
      if (p[order[r]] < sp.min_p * pmax) break;
    }
    keep = r;
  }
  std::vector<double> q(V, 0.0);
  double kept = 0;
  for (size_t r = 0; r < keep; ++r) kept += p[order[r]];
  for (size_t r = 0; r < keep; ++r) q[order[r]] = p[order[r]] / kept;
  return q;
}

// Pearson's chi-square of `counts` (n draws) against `want` over the ids where want > 0.
double chi_square(const std::vector<int>& counts, const std::vector<double>& want, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] > 0) {
      const double e = want[i] * n, d = counts[i] - e;
      chi2 += d * d / e;
    }
  return chi2;
}

// Expected chi-square of a sampler drawing from `alt` when the test expects `want` (same support):
// n · Σ (alt - want)² / want (the noncentrality; the mean is this plus df).
double power_against(const std::vector<double>& alt, const std::vector<double>& want, int n) {
  double s = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] > 0) s += (alt[i] - want[i]) * (alt[i] - want[i]) / want[i];
  return n * s;
}

// Draws kDraws samples from `logits` with `sp` and checks them against `want` (see above).
void check_distribution(const std::vector<float>& logits, const SamplingParams& sp, const std::vector<double>& want,
                        const std::string& what) {
  SCOPED_TRACE(what);
  const size_t V = want.size();
  size_t support = 0;
  for (double w : want) support += w > 0;
  ASSERT_GE(support, 2u) << "a one-id case cannot tell distributions apart";
  // Power: a uniform draw over the kept set must be far outside the threshold.
  std::vector<double> uniform(V, 0.0);
  for (size_t i = 0; i < V; ++i) uniform[i] = want[i] > 0 ? 1.0 / static_cast<double>(support) : 0.0;
  ASSERT_GE(power_against(uniform, want, kDraws), 10 * kChi2Max) << "case too close to uniform to test";
  if (sp.temperature != 1.0f) {
    // ... and so must a draw that ignores the temperature (softmax at T = 1 over the same kept set).
    SamplingParams t1 = sp;
    t1.temperature = 1.0f, t1.top_k = 0, t1.top_p = 1.0f, t1.min_p = 0.0f;
    std::vector<double> at1 = expected_dist(logits, t1);
    double m = 0;
    for (size_t i = 0; i < V; ++i) m += at1[i] = want[i] > 0 ? at1[i] : 0.0;
    for (double& v : at1) v /= m;
    ASSERT_GE(power_against(at1, want, kDraws), 10 * kChi2Max) << "case cannot see the temperature";
  }
  Sampler s(sp);
  std::vector<int> counts(V, 0);
  for (int i = 0; i < kDraws; ++i) {
    const int32_t id = s.sample(logits);
    ASSERT_GE(id, 0);
    ASSERT_LT(static_cast<size_t>(id), V);
    counts[static_cast<size_t>(id)]++;
  }
  for (size_t i = 0; i < V; ++i) {
    if (want[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " is outside the kept set but was drawn";
    }
  }
  const double chi2 = chi_square(counts, want, kDraws);
  std::string table;
  for (size_t i = 0; i < V; ++i)
    if (want[i] > 0)
      table += " id" + std::to_string(i) + " " + std::to_string(counts[i]) + "/" +
               std::to_string(static_cast<int>(std::lround(want[i] * kDraws)));
  std::printf("[ sampler ] %-36s chi-square %6.2f over %zu ids (limit %.0f)\n", what.c_str(), chi2, support, kChi2Max);
  EXPECT_LT(chi2, kChi2Max) << "chi-square " << chi2 << " over " << support << " ids (observed/expected):" << table;
}

struct DistCase {
  const char* name;
  SamplingParams sp;
  size_t kept;  // size of the kept set, worked out by hand from the table above (guards the helper too)
};

TEST(SamplerDistribution, MatchesSoftmaxOverTheKeptSet) {
  // Ranked ids 2 7 4 0 6 9 3 1 8 5. T = 1: .309 .229 .170 .103 .069 .046 .034 .021 .013 .007
  // T = 1.5: .237 .194 .159 .114 .087 .067 .055 .039 .028 .019
  // T = 2:   .201 .173 .149 .116 .095 .078 .067 .052 .041 .030
  const DistCase cases[] = {
      {"T=1", {1.0f, 0, 1.0f, 0.0f, 101}, 10},
      {"T=0.5", {0.5f, 0, 1.0f, 0.0f, 102}, 10},
      {"T=2", {2.0f, 0, 1.0f, 0.0f, 103}, 10},
      {"top_k=4", {1.0f, 4, 1.0f, 0.0f, 104}, 4},
      {"T=1.5 top_k=6", {1.5f, 6, 1.0f, 0.0f, 105}, 6},
      // cumulative .810 then .879 ≥ .85 → 5 ids.
      {"top_p=0.85", {1.0f, 0, 0.85f, 0.0f, 106}, 5},
      // T = 0.5 (.487 .268 .147 .054 ...): .487, .755, .902 ≥ .8 → 3 ids.
      {"T=0.5 top_p=0.8", {0.5f, 0, 0.8f, 0.0f, 107}, 3},
      // p / p_max: .741 .549 .333 ≥ .3 > .223 → 4 ids.
      {"min_p=0.3", {1.0f, 0, 1.0f, 0.3f, 108}, 4},
      // T = 1.5, p / p_max: ... .282 .231 ≥ .2 > .165 → 7 ids.
      {"T=1.5 min_p=0.2", {1.5f, 0, 1.0f, 0.2f, 109}, 7},
      // top-p over the top-8 RENORMALISED mass (.953): .249 .453 .620 .740 .831 ≥ .8 → 5 ids (6 if top-p
      // summed the full distribution: .792 < .8).
      {"T=1.5 top_k=8 top_p=0.8", {1.5f, 8, 0.8f, 0.0f, 110}, 5},
      // T = 2: min_p .3 keeps 7 (.333 ≥ .3 > .259), top_k 9 → 7 ids.
      {"T=2 top_k=9 min_p=0.3", {2.0f, 9, 1.0f, 0.3f, 111}, 7},
      // T = 1.5: top_p .75 → 5 ids (.705 < .75 ≤ .792), min_p .1 alone would keep 9.
      {"T=1.5 top_p=0.75 min_p=0.1", {1.5f, 0, 0.75f, 0.1f, 112}, 5},
      // All four, min-p binding: T = 2.5 (.179 .159 .141 .115 .098 .084 .074 ...); top-p .85 over the top-7
      // mass: .211 .397 .563 .699 .814 .913 → 6; min_p .5 (p / p_max .887 .787 .644 .549 ≥ .5 > .468) → 5 ids.
      {"T=2.5 top_k=7 top_p=0.85 min_p=0.5", {2.5f, 7, 0.85f, 0.5f, 113}, 5},
      // T = 0.5; top-p .95 over the top-5 mass: .497 .770 .920 .975 → 4; min_p .2 (.549 .301 ≥ .2 > .111)
      // → 3 ids.
      {"T=0.5 top_k=5 top_p=0.95 min_p=0.2", {0.5f, 5, 0.95f, 0.2f, 114}, 3},
  };
  const auto l = dist_logits();
  for (const auto& c : cases) {
    const auto want = expected_dist(l, c.sp);
    size_t kept = 0;
    for (double w : want) kept += w > 0;
    EXPECT_EQ(kept, c.kept) << c.name;
    check_distribution(l, c.sp, want, c.name);
  }
}

// Penalties (scheduler/logits_processor, applied to the raw logits before the sampler, as
// Scheduler::sample_and_emit does): repetition (HF/vLLM: positive logits divided, negative multiplied,
// for every id in prompt + generated), then presence + frequency · count (OpenAI) for generated ids.
// The penalised logits are checked against the formula, then the draws against softmax over them.
TEST(SamplerDistribution, PenaltiesShiftTheDistribution) {
  GenerationParams gp;
  gp.repetition_penalty = 1.3f, gp.presence_penalty = 0.5f, gp.frequency_penalty = 0.4f;
  const std::vector<int32_t> prompt = {2, 8};
  const std::vector<int32_t> generated = {7, 7, 4, 1, 7};
  const auto raw = dist_logits();
  LogitsProcessor proc(gp, static_cast<int>(raw.size()), prompt);
  ASSERT_TRUE(proc.active());
  for (int32_t t : generated) proc.observe_generated(t);
  std::vector<float> pen = raw;
  proc.apply(pen);
  // Independent formula, id by id.
  std::vector<float> want_logits = raw;
  auto rep = [&](size_t i) { want_logits[i] = raw[i] > 0 ? raw[i] / 1.3f : raw[i] * 1.3f; };
  rep(2), rep(8), rep(7), rep(4), rep(1);  // in prompt or generated
  want_logits[7] -= 0.5f + 0.4f * 3;       // generated 3 times
  want_logits[4] -= 0.5f + 0.4f * 1;
  want_logits[1] -= 0.5f + 0.4f * 1;       // negative logit: multiplied, then shifted
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_NEAR(pen[i], want_logits[i], 1e-5f) << "id " << i;
  // Penalised ranking: id2 1.769, id0 1.2, id6 .8, id4 .408, id9 .4, id3 .1, id7 -.162, ...: id 7 falls from
  // 2nd to 7th (out of the top-5 below), id 4 from 3rd to 4th; the draws must follow.
  for (const DistCase& c : {DistCase{"penalised T=1", {1.0f, 0, 1.0f, 0.0f, 201}, 10},
                            DistCase{"penalised T=0.6 top_k=5", {0.6f, 5, 1.0f, 0.0f, 202}, 5}}) {
    const auto want = expected_dist(want_logits, c.sp);
    EXPECT_EQ(static_cast<size_t>(std::count_if(want.begin(), want.end(), [](double w) { return w > 0; })), c.kept);
    // The penalties must matter: the unpenalised distribution is far from the penalised one.
    const SamplingParams plain{c.sp.temperature, 0, 1.0f, 0.0f, 0};
    EXPECT_GE(power_against(expected_dist(raw, plain), expected_dist(want_logits, plain), kDraws), 10 * kChi2Max);
    check_distribution(pen, c.sp, want, c.name);
  }
  // Without penalties the processor is inactive and leaves the logits alone.
  LogitsProcessor off(GenerationParams{}, static_cast<int>(raw.size()), prompt);
  EXPECT_FALSE(off.active());
  std::vector<float> same = raw;
  off.observe_generated(7);
  off.apply(same);
  EXPECT_EQ(same, raw);
}

}  // namespace
}  // namespace kestrel
