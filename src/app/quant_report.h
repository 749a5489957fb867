// Accuracy of a quantized checkpoint against its unquantized source: next-token distributions of
// both models over a fixed prompt set (deterministic token ids), compared position by position.
//   KL(p_ref ‖ p_q) = Σ_v p_ref(v) · (log p_ref(v) − log p_q(v))   (nats, fp64 log-softmax)
//   top-1 agreement = fraction of positions whose argmax token is the same.
// Both models run the same engine; only the weights (and the int8 activation path) differ.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"

namespace kestrel::app {

struct PromptSet {
  int prompts = 8;
  int length = 64;      // tokens per prompt; every position is scored
  uint64_t seed = 2026; // splitmix64 seed for the token ids
};

struct AccuracyReport {
  PromptSet set;
  int64_t positions = 0;
  double kl_mean = 0, kl_max = 0;
  double top1 = 0;  // in [0, 1]
};

Result<AccuracyReport> accuracy_report(const std::string& ref_dir, const std::string& quant_dir, const PromptSet& set);

}  // namespace kestrel::app
