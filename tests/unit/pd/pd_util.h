// Shared by the hand-off tests (one process, two processes): the scheduler configuration both sides use, the
// prompts, the bitwise comparison of two generations, and waiting for a scheduler's pools to be empty.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/scheduler_client.h"
#include "scheduler/scheduler.h"

namespace kestrel::pd::testing {

using kestrel::testing::Collected;

inline constexpr int64_t kPage = 16;

inline SchedulerConfig config() {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.prefill_chunk = 32;
  c.max_context = 512;
  c.cache.page_tokens = kPage;
  c.cache.max_slots = 4;
  c.cache.budget_bytes = 96ll << 20;
  return c;
}

inline std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101 + 5) % 500);
  return p;
}

// The prompt lengths every parity test runs: one token, a page boundary ± 1, and several chunks.
inline std::vector<int> prompt_lengths() { return {1, static_cast<int>(kPage) - 1, static_cast<int>(kPage), static_cast<int>(kPage) + 1, 100}; }

template <typename T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Tokens, logprobs and top logprobs identical to the bit.
inline bool bit_equal(const Collected& a, const Collected& b) {
  if (a.tokens != b.tokens || a.logprobs.size() != b.logprobs.size() || a.tops.size() != b.tops.size()) return false;
  for (size_t i = 0; i < a.logprobs.size(); ++i)
    if (!same_bits(a.logprobs[i], b.logprobs[i])) return false;
  for (size_t i = 0; i < a.tops.size(); ++i) {
    if (a.tops[i].size() != b.tops[i].size()) return false;
    for (size_t j = 0; j < a.tops[i].size(); ++j)
      if (a.tops[i][j].id != b.tops[i][j].id || !same_bits(a.tops[i][j].logprob, b.tops[i][j].logprob)) return false;
  }
  return true;
}

// Waits (bounded) until the scheduler holds no page and no slot; returns its stats then.
inline ServiceStats settled(Scheduler& s, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  ServiceStats st = s.stats();
  while ((st.kv_blocks_used != 0 || st.state_slots_used != 0 || st.running != 0) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = s.stats();
  }
  return st;
}

}  // namespace kestrel::pd::testing
