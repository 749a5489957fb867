// Latency histograms and counters for /metrics (Prometheus text is rendered by server/).
// Not thread-safe by itself: the scheduler guards it with its mutex.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kestrel {

class Histogram {
 public:
  Histogram() : Histogram({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {}
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double v) {
    for (size_t i = 0; i < bounds_.size(); ++i)
      if (v <= bounds_[i]) counts_[i]++;  // cumulative, as Prometheus expects
    sum_ += v;
    ++n_;
  }
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }
  int64_t n() const { return n_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t n_ = 0;
};

struct Metrics {
  Histogram ttft, tpot;
  // Sequences per batched forward (decodes + prefill chunks), and the most seen in one forward: shows
  // whether requests really share forwards (continuous batching) or run one at a time.
  Histogram step_sequences{{1, 2, 4, 8, 16, 32, 64, 128}};
  int64_t step_sequences_max = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, preemptions = 0, cancelled = 0, finished = 0;
};

}  // namespace kestrel
