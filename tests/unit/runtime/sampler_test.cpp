// Sampling: greedy, temperature, top-k / top-p / min-p restrict the support, and a seed reproduces.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "runtime/sampler.h"

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

}  // namespace
}  // namespace kestrel
