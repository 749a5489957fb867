#include "scheduler/logits_processor.h"

#include <algorithm>
#include <cmath>

namespace kestrel {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kTimeout: return "timeout";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "none";
}

LogitsProcessor::LogitsProcessor(const GenerationParams& p, int vocab, std::span<const int32_t> prompt) : p_(p) {
  active_ = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (!active_) return;
  in_context_.assign(static_cast<size_t>(vocab), 0);
  generated_count_.assign(static_cast<size_t>(vocab), 0);
  for (int32_t t : prompt)
    if (t >= 0 && t < vocab) in_context_[static_cast<size_t>(t)] = 1;
}

void LogitsProcessor::observe_generated(int32_t token) {
  if (!active_ || token < 0 || static_cast<size_t>(token) >= in_context_.size()) return;
  in_context_[static_cast<size_t>(token)] = 1;
  generated_count_[static_cast<size_t>(token)]++;
}

void LogitsProcessor::apply(std::span<float> logits) const {
  if (!active_) return;
  for (size_t i = 0; i < logits.size() && i < in_context_.size(); ++i) {
    float& l = logits[i];
    if (p_.repetition_penalty != 1.0f && in_context_[i]) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    const int32_t c = generated_count_[i];
    if (c > 0) l -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(c);
  }
}

float LogitsProcessor::logprob_of(std::span<const float> logits, int32_t token, int n, std::vector<TokenLogprob>& top,
                                  std::vector<std::pair<float, int32_t>>& scratch) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  top.clear();
  if (n > 0) {
    scratch.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) scratch[i] = {logits[i], static_cast<int32_t>(i)};
    const size_t k = std::min<size_t>(static_cast<size_t>(n), scratch.size());
    std::partial_sort(scratch.begin(), scratch.begin() + static_cast<long>(k), scratch.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (size_t i = 0; i < k; ++i) top.push_back({scratch[i].second, scratch[i].first - lse});
  }
  return logits[static_cast<size_t>(token)] - lse;
}

}  // namespace kestrel
