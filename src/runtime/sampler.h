// Token sampling: greedy, temperature, top-k, top-p, min-p, with a per-request seed so results
// are reproducible. Order: temperature → top-k → top-p → min-p → draw (vLLM/llama.cpp order).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kestrel {

struct SamplingParams {
  float temperature = 0.0f;  // 0 → greedy
  int top_k = 0;             // 0 → off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t sample(std::span<const float> logits);
  static int32_t argmax(std::span<const float> logits);
  // Advances the random stream as sample() does for one token (disaggregation: another instance drew the first
  // token with the same seed, this one continues from there).
  void skip_draw();

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused, no allocation per token in steady state
};

}  // namespace kestrel
