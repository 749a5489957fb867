// Steady-state decode performs no heap allocation: global operator new is counted in this binary
// and must stay flat across decode steps once caches are reserved and scratch is warm.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "common/test_util.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace {
std::atomic<long> g_allocs{0};
}

void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kestrel {
namespace {

class DecodeAlloc : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeAlloc, NoAllocationPerDecodedToken) {
  testing::TempDir tmp;
  testing::make_checkpoint(GetParam(), tmp.path());
  auto eng = Engine::load(tmp.path());
  ASSERT_TRUE(eng) << eng.error().message();
  Engine& e = **eng;
  SequenceState s = e.new_sequence();
  e.reserve(s, 256);
  std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29};
  auto r = e.prefill(s, prompt, 0);
  ASSERT_TRUE(r);
  std::vector<float> logits = *r;
  Sampler sampler(SamplingParams{0.8f, 40, 0.95f, 0.01f, 7});
  auto step = [&] {
    const int32_t tok = sampler.sample(logits);
    ASSERT_TRUE(e.decode_into(s, tok, logits).is_ok());
  };
  for (int i = 0; i < 40; ++i) step();  // warm scratch, expert lists, sampler buffers
  const long before = g_allocs.load();
  for (int i = 0; i < 64; ++i) step();
  EXPECT_EQ(g_allocs.load() - before, 0) << "heap allocations during 64 decode steps";
}

INSTANTIATE_TEST_SUITE_P(Tiny, DecodeAlloc, ::testing::Values("k3-tiny", "kimi-linear-tiny", "deepseek-v3-tiny", "deepseek-v32-tiny",
                                                       "deepseek-v32-sparse-tiny", "k3-tiny-dsa"));

}  // namespace
}  // namespace kestrel
