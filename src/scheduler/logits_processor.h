// Per-request logits processing before sampling: repetition (HF/vLLM: divide positive logits,
// multiply negative ones, over prompt + generated tokens), presence and frequency penalties
// (OpenAI: over generated tokens), and log-probabilities for the OpenAI `logprobs` fields.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "scheduler/request.h"

namespace kestrel {

class LogitsProcessor {
 public:
  // Allocates the per-token count tables once (only when a penalty is active).
  LogitsProcessor(const GenerationParams& p, int vocab, std::span<const int32_t> prompt);
  bool active() const { return active_; }
  void apply(std::span<float> logits) const;
  void observe_generated(int32_t token);

  // log_softmax of `logits` at `token`, and the top n entries (n may be 0). No allocation once
  // `scratch` has grown to the vocabulary size.
  static float logprob_of(std::span<const float> logits, int32_t token, int n, std::vector<TokenLogprob>& top,
                          std::vector<std::pair<float, int32_t>>& scratch);

 private:
  GenerationParams p_;
  bool active_ = false;
  std::vector<uint8_t> in_context_;      // prompt or generated (repetition penalty)
  std::vector<int32_t> generated_count_; // presence / frequency penalties
};

}  // namespace kestrel
