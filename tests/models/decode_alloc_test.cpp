// Steady-state decode performs no heap allocation, on every decode path: Engine::decode_into on each
// tiny preset (fp32 activations), the GGUF files from llama.cpp's converter in their default mode
// (int8 products with Q8_0 activations where the CPU has AVX-512 VNNI), `--kernels fast` (MXFP4
// experts × int8 activations, bf16 activations on BF16 weights where the CPU has AVX512-BF16), one
// batched forward_batch decode of several sequences, and the scheduler loop itself with several
// requests decoding. Every allocation entry point is counted in this binary, from every thread
// (OpenMP workers and the scheduler thread too): all replaceable operator new forms (plain, array,
// nothrow, align_val_t) and malloc, calloc, realloc, reallocarray, posix_memalign, aligned_alloc,
// memalign, valloc, pvalloc, interposed here over glibc's __libc_* entry points.
#include <execinfo.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>

#include "common/test_util.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "scheduler/scheduler.h"

namespace {
std::atomic<long> g_allocs{0};

// While a window is measured, the call stacks of its first allocations are kept (fixed storage, no
// allocation) so that a failure names where they came from.
constexpr int kSites = 4, kFrames = 24;
std::atomic<bool> g_record{false};
std::atomic<int> g_sites{0};
void* g_site_frames[kSites][kFrames];
int g_site_depth[kSites];
thread_local bool t_in_hook = false;

inline void count_one() {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (!g_record.load(std::memory_order_relaxed) || t_in_hook) return;
  t_in_hook = true;
  const int i = g_sites.fetch_add(1);
  if (i < kSites) g_site_depth[i] = backtrace(g_site_frames[i], kFrames);
  t_in_hook = false;
}

// Starts keeping call stacks (backtrace loads its unwinder on first use: done here, outside the window).
void record_sites() {
  void* warm[2];
  backtrace(warm, 2);
  g_sites = 0;
  g_record = true;
}

// Stops keeping them; prints those kept to stderr (the test binary exports its symbols).
void report_sites() {
  g_record = false;
  const int n = std::min(g_sites.load(), kSites);
  for (int i = 0; i < n; ++i) {
    std::fprintf(stderr, "-- allocation %d of %d in the window:\n", i + 1, g_sites.load());
    backtrace_symbols_fd(g_site_frames[i], g_site_depth[i], 2);
  }
}
}  // namespace

// Under AddressSanitizer its own allocator must stay in charge: only operator new is counted there.
#if defined(__SANITIZE_ADDRESS__)  // GCC
#define KESTREL_COUNT_MALLOC 0
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define KESTREL_COUNT_MALLOC 0
#endif
#endif
#ifndef KESTREL_COUNT_MALLOC
#define KESTREL_COUNT_MALLOC 1
#endif

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

#if KESTREL_COUNT_MALLOC
void* malloc(size_t n) noexcept {
  count_one();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t m) noexcept {
  count_one();
  return __libc_calloc(n, m);
}
void* realloc(void* p, size_t n) noexcept {
  count_one();
  return __libc_realloc(p, n);
}
void* reallocarray(void* p, size_t n, size_t m) noexcept {
  count_one();
  if (m != 0 && n > static_cast<size_t>(-1) / m) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_realloc(p, n * m);
}
int posix_memalign(void** out, size_t align, size_t n) noexcept {
  count_one();
  if (align % sizeof(void*) != 0 || (align & (align - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void* aligned_alloc(size_t align, size_t n) noexcept {
  count_one();
  return __libc_memalign(align, n);
}
void* memalign(size_t align, size_t n) noexcept {
  count_one();
  return __libc_memalign(align, n);
}
void* valloc(size_t n) noexcept {
  count_one();
  return __libc_memalign(4096, n);
}
void* pvalloc(size_t n) noexcept {
  count_one();
  return __libc_memalign(4096, (n + 4095) & ~static_cast<size_t>(4095));
}
#endif
}  // extern "C"

namespace {
void* counted_new(std::size_t n, std::size_t align) {
  count_one();
  if (n == 0) n = 1;
#if KESTREL_COUNT_MALLOC
  return align <= alignof(std::max_align_t) ? __libc_malloc(n) : __libc_memalign(align, n);
#else
  return align <= alignof(std::max_align_t) ? std::malloc(n) : std::aligned_alloc(align, (n + align - 1) / align * align);
#endif
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted_new(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_new(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_new(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = counted_new(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_new(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_new(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace kestrel {
namespace {

std::string gguf(const char* f) { return std::string(KESTREL_TEST_DATA) + "/gguf/" + f; }

// The hook itself: every entry point counts exactly once (called through volatile pointers so the
// compiler cannot elide the allocation), including from a std::thread.
TEST(AllocHook, CountsEveryEntryPoint) {
  struct alignas(128) Wide {
    char c[128];
  };
  auto once = [](const char* what, const auto& fn) {
    const long before = g_allocs.load();
    fn();
    EXPECT_EQ(g_allocs.load() - before, 1) << what;
  };
  void* volatile p = nullptr;
  if (!KESTREL_COUNT_MALLOC) GTEST_SKIP() << "AddressSanitizer build: malloc is not interposed";
  once("malloc", [&] { p = std::malloc(24); });
  once("realloc", [&] { p = std::realloc(p, 4096); });
  std::free(p);
  once("calloc", [&] { p = std::calloc(3, 8); });
  std::free(p);
  once("reallocarray", [&] { p = reallocarray(nullptr, 3, 8); });
  std::free(p);
  void* q = nullptr;
  once("posix_memalign", [&] { ASSERT_EQ(posix_memalign(&q, 64, 100), 0); });
  std::free(q);
  once("aligned_alloc", [&] { p = std::aligned_alloc(64, 128); });
  std::free(p);
  once("memalign", [&] { p = memalign(64, 100); });
  std::free(p);
  once("valloc", [&] { p = valloc(100); });
  std::free(p);
  once("new", [&] { p = new int(1); });
  delete static_cast<int*>(p);
  once("new[]", [&] { p = new int[5]; });
  delete[] static_cast<int*>(p);
  once("new nothrow", [&] { p = new (std::nothrow) int(2); });
  delete static_cast<int*>(p);
  once("new aligned", [&] { p = new Wide; });
  delete static_cast<Wide*>(p);
  once("new[] aligned", [&] { p = new Wide[2]; });
  delete[] static_cast<Wide*>(p);
  once("new aligned nothrow", [&] { p = new (std::nothrow) Wide; });
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 128, 0u);
  delete static_cast<Wide*>(p);
  const long before = g_allocs.load();
  std::thread([&] { p = std::malloc(10); }).join();
  EXPECT_GE(g_allocs.load() - before, 1) << "malloc on another thread";
  std::free(p);
}

// Warm up (scratch, expert lists, sampler buffers), then count over 64 decode steps.
void expect_no_alloc_decoding(Engine& e) {
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
  for (int i = 0; i < 40; ++i) step();
  record_sites();
  const long before = g_allocs.load();
  for (int i = 0; i < 64; ++i) step();
  const long n = g_allocs.load() - before;
  report_sites();
  EXPECT_EQ(n, 0) << "heap allocations during 64 decode steps (their call stacks are printed above)";
}

class DecodeAlloc : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeAlloc, NoAllocationPerDecodedToken) {
  testing::TempDir tmp;
  testing::make_checkpoint(GetParam(), tmp.path());
  auto eng = Engine::load(tmp.path());
  ASSERT_TRUE(eng) << eng.error().message();
  expect_no_alloc_decoding(**eng);
}

INSTANTIATE_TEST_SUITE_P(Tiny, DecodeAlloc, ::testing::Values("k3-tiny", "kimi-linear-tiny", "deepseek-v3-tiny", "deepseek-v32-tiny",
                                                       "deepseek-v32-sparse-tiny", "k3-tiny-dsa"));

// GGUF files in the default mode (int8 where the CPU has AVX-512 VNNI, the exact path elsewhere; the
// BF16 file takes bf16 activations where the CPU has AVX512-BF16).
class DecodeAllocGguf : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeAllocGguf, NoAllocationPerDecodedToken) {
  std::printf("GGUF int8 mode %s, bf16 activations %s\n",
              kernels::gguf_int8_applies(kernels::WeightMatrix{kernels::WeightFormat::kGgufQ8_0}) ? "on" : "off (no AVX-512 VNNI)",
              kernels::cpu_has_avx512bf16() ? "on" : "off (no AVX512-BF16)");
  auto eng = Engine::load(gguf(GetParam()));
  ASSERT_TRUE(eng) << eng.error().message();
  expect_no_alloc_decoding(**eng);
}

INSTANTIATE_TEST_SUITE_P(Micro, DecodeAllocGguf,
                         ::testing::Values("k3_micro_q4_0.gguf", "k3_micro_q8_0.gguf", "k3_micro_mxfp4.gguf",
                                           "kimi_linear_micro_bf16.gguf", "deepseek_v3_micro_q4_0.gguf",
                                           "deepseek_v3_micro_bf16.gguf", "deepseek_v2_lite_micro_q4_0.gguf",
                                           "deepseek_v2_lite_micro_bf16.gguf"));

// `--kernels fast` on a K3 checkpoint (MXFP4 experts: int8 activations; BF16 elsewhere: bf16
// activations where the CPU has AVX512-BF16). The switches are read when the weights are bound, so
// the engine is loaded after setting them.
TEST(DecodeAllocFast, NoAllocationPerDecodedToken) {
  kernels::set_bf16_acts(true);
  kernels::set_mxfp4_int8(true);
  struct Restore {
    ~Restore() {
      kernels::set_bf16_acts(false);
      kernels::set_mxfp4_int8(false);
    }
  } restore;
  testing::TempDir tmp;
  testing::make_checkpoint("k3-tiny", tmp.path());
  auto eng = Engine::load(tmp.path());
  ASSERT_TRUE(eng) << eng.error().message();
  expect_no_alloc_decoding(**eng);
}

// One forward_batch per step decoding 5 sequences of different lengths together (the scheduler's
// batched path: grouped MoE, batched KDA recurrences and absorbed MLA over all sequences; K3 and
// DeepSeek V3).
class DecodeAllocBatched : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeAllocBatched, NoAllocationPerBatchedStep) {
  testing::TempDir tmp;
  testing::make_checkpoint(GetParam(), tmp.path());
  auto eng = Engine::load(tmp.path());
  ASSERT_TRUE(eng) << eng.error().message();
  Engine& e = **eng;
  constexpr int kSeqs = 5;
  std::vector<SequenceState> st;
  std::vector<int32_t> next(kSeqs);
  std::vector<SeqRun> runs;
  for (int i = 0; i < kSeqs; ++i) {
    st.push_back(e.new_sequence());
    e.reserve(st.back(), 256);
  }
  for (int i = 0; i < kSeqs; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 5 + 7 * i; ++t) prompt.push_back((t * 31 + i * 11 + 3) % 500);
    auto r = e.prefill(st[static_cast<size_t>(i)], prompt, 0);
    ASSERT_TRUE(r);
    next[static_cast<size_t>(i)] = Sampler::argmax(*r);
    runs.push_back(SeqRun{&next[static_cast<size_t>(i)], 1, &st[static_cast<size_t>(i)], false});
  }
  const int64_t V = e.config().text.vocab_size;
  std::vector<float> logits;
  auto step = [&] {
    e.model().forward_batch(runs, logits);
    for (int i = 0; i < kSeqs; ++i)
      next[static_cast<size_t>(i)] = Sampler::argmax({logits.data() + i * V, static_cast<size_t>(V)});
  };
  for (int i = 0; i < 30; ++i) step();
  record_sites();
  const long before = g_allocs.load();
  for (int i = 0; i < 40; ++i) step();
  const long n = g_allocs.load() - before;
  report_sites();
  EXPECT_EQ(n, 0) << "heap allocations during 40 batched decode steps of " << kSeqs << " sequences (call stacks above)";
}

INSTANTIATE_TEST_SUITE_P(Tiny, DecodeAllocBatched,
                         ::testing::Values("k3-tiny", "deepseek-v3-tiny"));

// The scheduler loop in steady decode: 4 requests (sampling, penalties, top-5 logprobs) admitted
// together; from the 60th to the 260th token event (all four decoding, none admitted or finished in
// between) nothing is allocated on any thread. The event callback itself only counts.
TEST(DecodeAllocScheduler, NoAllocationPerSchedulerStep) {
  testing::TempDir tmp;
  testing::make_checkpoint("k3-tiny", tmp.path());
  auto eng = Engine::load(tmp.path());
  ASSERT_TRUE(eng) << eng.error().message();
  SchedulerConfig c;
  c.cache.budget_bytes = 64ll << 20;
  auto sched = Scheduler::create(**eng, c);
  ASSERT_TRUE(sched) << sched.error().message();
  std::atomic<long> events{0}, at_start{-1}, at_end{-1}, finals{0};
  std::atomic<int> min_batch{1 << 30};
  std::mutex mu;
  std::condition_variable cv;
  constexpr long kStart = 60, kEnd = 260;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    for (int t = 0; t < 20 + 9 * i; ++t) r.prompt.push_back((t * 37 + i * 101 + 5) % 500);
    r.params.temperature = 0.8f, r.params.top_k = 40, r.params.top_p = 0.95f;
    r.params.seed = 11 + static_cast<uint64_t>(i), r.params.has_seed = true;
    r.params.frequency_penalty = 0.3f, r.params.repetition_penalty = 1.1f;
    r.params.top_logprobs = 5;
    r.params.max_new_tokens = 120;
    r.on_event = [&](const GenerationEvent& ev) {
      if (ev.finish != FinishReason::kNone) {
        finals.fetch_add(1);
        std::lock_guard<std::mutex> lk(mu);
        cv.notify_all();
        return;
      }
      const long n = events.fetch_add(1) + 1;
      if (n == kStart) {
        record_sites();
        at_start = g_allocs.load();
      }
      if (n > kStart && n <= kEnd) {
        int m = min_batch.load();
        while (ev.step_sequences < m && !min_batch.compare_exchange_weak(m, ev.step_sequences)) {
        }
      }
      if (n == kEnd) {
        at_end = g_allocs.load();
        g_record = false;
      }
    };
    ASSERT_TRUE((*sched)->submit(std::move(r)));
  }
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(300), [&] { return finals.load() == 4; }));
  }
  ASSERT_GE(at_end.load(), 0);
  report_sites();
  EXPECT_EQ(min_batch.load(), 4) << "the measured steps did not all decode the four requests together";
  EXPECT_EQ(at_end.load() - at_start.load(), 0) << "heap allocations during " << kEnd - kStart
                                                << " tokens of batched scheduler decode";
}

}  // namespace
}  // namespace kestrel
