#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace kestrel {

int32_t Sampler::argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void Sampler::skip_draw() {
  if (p_.temperature <= 0.0f || p_.top_k == 1) return;
  std::uniform_real_distribution<double>(0.0, 1.0)(rng_);  // one draw, whatever the bound
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (p_.temperature <= 0.0f || p_.top_k == 1) return argmax(logits);
  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {logits[i] / p_.temperature, static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  const float mx = cand_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (cand_[i].first = std::exp(cand_[i].first - mx));
  for (size_t i = 0; i < n; ++i) cand_[i].first = static_cast<float>(cand_[i].first / sum);
  if (p_.top_p < 1.0f) {
    double c = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      c += cand_[i].first;
      if (c >= p_.top_p) { keep = i + 1; break; }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const float thr = p_.min_p * cand_[0].first;
    size_t keep = 1;
    while (keep < n && cand_[keep].first >= thr) ++keep;
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += cand_[i].first;
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double c = 0;
  for (size_t i = 0; i < n; ++i) {
    c += cand_[i].first;
    if (r < c) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace kestrel
