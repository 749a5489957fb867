// The live heap and its peak, for tests that replace operator new / delete to measure how much a call
// allocates: they call track(+bytes) on each allocation and track(-bytes) on each release.
#pragma once

#include <atomic>
#include <cstdint>

namespace kestrel::test {

inline std::atomic<int64_t> g_live{0}, g_peak{0};

inline void track(int64_t d) {
  const int64_t v = g_live.fetch_add(d, std::memory_order_relaxed) + d;
  int64_t p = g_peak.load(std::memory_order_relaxed);
  while (v > p && !g_peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

}  // namespace kestrel::test
