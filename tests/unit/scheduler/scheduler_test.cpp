// Scheduler and cache pools on a real tiny model: batching must not change results (bitwise),
// sequences never see each other's KDA slots or MLA pages, cancellation/timeouts free resources,
// preemption by recompute keeps outputs identical, the waiting queue is bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "common/test_util.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "scheduler/scheduler.h"

namespace kestrel {
namespace {

using namespace std::chrono_literals;

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> tops;
  std::vector<int> step_sequences;  // per token: sequences in the forward that produced it
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

// Submits and collects events; wait() blocks until the final event.
class Client {
 public:
  GenerationRequest make(std::vector<int32_t> prompt, int max_new, float temperature = 0.0f, int top_lp = 5) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.params.temperature = temperature;
    r.params.max_new_tokens = max_new;
    r.params.top_logprobs = top_lp;
    r.params.seed = 3, r.params.has_seed = true;
    r.on_event = [this](const GenerationEvent& e) {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.finish == FinishReason::kNone) {
        out_.tokens.push_back(e.token);
        out_.logprobs.push_back(e.logprob);
        out_.tops.push_back(e.top);
        out_.step_sequences.push_back(e.step_sequences);
      } else {
        out_.finish = e.finish;
        out_.error = e.error;
        done_ = true;
        cv_.notify_all();
      }
    };
    return r;
  }
  Collected wait(std::chrono::seconds limit = 120s) {
    std::unique_lock<std::mutex> lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, limit, [&] { return done_; })) << "request did not finish";
    return out_;
  }
  size_t tokens_so_far() {
    std::lock_guard<std::mutex> lk(mu_);
    return out_.tokens.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Collected out_;
  bool done_ = false;
};

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101 + 5) % 500);
  return p;
}

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::make_checkpoint("k3-tiny", dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    auto e = Engine::load(dir_->path());
    ASSERT_TRUE(e) << e.error().message();
    engine_ = std::move(*e);
  }
  std::unique_ptr<Scheduler> make(SchedulerConfig c = {}) {
    if (c.cache.budget_bytes == (1ll << 30)) c.cache.budget_bytes = 256ll << 20;
    auto s = Scheduler::create(*engine_, c);
    EXPECT_TRUE(s) << s.error().message();
    return std::move(*s);
  }
  static testing::TempDir* dir_;
  std::unique_ptr<Engine> engine_;
};
testing::TempDir* SchedulerTest::dir_ = nullptr;

Collected run_alone(Scheduler& s, std::vector<int32_t> p, int n) {
  Client c;
  EXPECT_TRUE(s.submit(c.make(std::move(p), n)));
  return c.wait();
}

// The target request alone, then submitted amid `others` (prompt length, new tokens, temperature), as
// the `at`-th submission: same tokens, bit-identical log-probabilities and top-5 lists. Co-batching is
// checked, not assumed: every solo token came from a forward of one sequence, and at least `min_shared`
// of the target's batched tokens came from forwards that also ran other sequences.
struct Other {
  int prompt_len, max_new;
  float temperature;
};

void expect_batched_equals_alone(Scheduler& s, int target_len, int target_new, const std::vector<Other>& others,
                                 size_t at, int min_shared) {
  const Collected alone = run_alone(s, prompt(target_len, 0), target_new);
  ASSERT_EQ(alone.tokens.size(), static_cast<size_t>(target_new));
  for (int n : alone.step_sequences) ASSERT_EQ(n, 1) << "the solo run shared a forward";
  std::vector<std::unique_ptr<Client>> clients;
  Client target;
  for (size_t i = 0; i < others.size(); ++i) {
    if (i == at) {
      ASSERT_TRUE(s.submit(target.make(prompt(target_len, 0), target_new)));
    }
    clients.push_back(std::make_unique<Client>());
    const Other& o = others[i];
    ASSERT_TRUE(s.submit(clients.back()->make(prompt(o.prompt_len, static_cast<int>(i) + 1), o.max_new, o.temperature)));
  }
  const Collected batched = target.wait();
  for (auto& o : clients) EXPECT_EQ(o->wait().finish, FinishReason::kLength);
  const auto shared = std::count_if(batched.step_sequences.begin(), batched.step_sequences.end(), [](int n) { return n > 1; });
  const int widest = batched.step_sequences.empty() ? 0 : *std::max_element(batched.step_sequences.begin(), batched.step_sequences.end());
  std::printf("target: %ld of %zu tokens from shared forwards (widest %d sequences); scheduler: %ld forwards, at most %ld sequences\n",
              static_cast<long>(shared), batched.step_sequences.size(), widest, static_cast<long>(s.stats().steps_total),
              static_cast<long>(s.stats().step_sequences_max));
  EXPECT_GE(shared, min_shared) << "the target ran alone: batch invariance was not exercised";
  EXPECT_GE(s.stats().step_sequences_max, widest);
  EXPECT_EQ(batched.tokens, alone.tokens);
  // Bitwise: log-probabilities are a function of the logits; compare them exactly.
  ASSERT_EQ(batched.logprobs.size(), alone.logprobs.size());
  for (size_t i = 0; i < alone.logprobs.size(); ++i) {
    EXPECT_EQ(batched.logprobs[i], alone.logprobs[i]) << "token " << i;
    ASSERT_EQ(batched.tops[i].size(), alone.tops[i].size());
    for (size_t j = 0; j < alone.tops[i].size(); ++j) {
      EXPECT_EQ(batched.tops[i][j].id, alone.tops[i][j].id);
      EXPECT_EQ(batched.tops[i][j].logprob, alone.tops[i][j].logprob);
    }
  }
}

// 7 others of 50..230 prompt tokens and 11..17 new tokens (odd ones sampled at temperature 0.8).
std::vector<Other> seven_others() {
  std::vector<Other> o;
  for (int i = 1; i <= 7; ++i) o.push_back({20 + 30 * i, 10 + i, i % 2 ? 0.8f : 0.0f});
  return o;
}

TEST_F(SchedulerTest, BatchedEqualsAloneBitwise) {
  auto sched = make();
  expect_batched_equals_alone(*sched, 150, 24, seven_others(), 3, 10);
}

// Restores the exact kernels when a test that switched to the fast ones ends.
struct FastKernels {
  FastKernels() {
    kernels::set_bf16_acts(true);
    kernels::set_mxfp4_int8(true);
  }
  ~FastKernels() {
    kernels::set_bf16_acts(false);
    kernels::set_mxfp4_int8(false);
  }
};

// `--kernels fast`: MXFP4 experts × int8 activations (W4A8 kernels, every ISA) and bf16 activations on
// BF16 weights (where the CPU has AVX512-BF16). The fast path must really run (its log-probabilities
// differ from the exact path's) and stay bitwise batch-invariant.
TEST_F(SchedulerTest, BatchedEqualsAloneBitwiseFastKernels) {
  Collected exact;
  {
    auto sched = make();
    exact = run_alone(*sched, prompt(150, 0), 24);
  }
  FastKernels fast;
  auto e = Engine::load(dir_->path());  // the switches are read when weights are bound
  ASSERT_TRUE(e) << e.error().message();
  engine_ = std::move(*e);
  auto sched = make();
  const Collected f = run_alone(*sched, prompt(150, 0), 24);
  ASSERT_EQ(f.logprobs.size(), exact.logprobs.size());
  EXPECT_NE(f.logprobs, exact.logprobs) << "--kernels fast computed exactly what the exact kernels compute";
  std::printf("bf16 activations: %s\n", kernels::cpu_has_avx512bf16() ? "on (AVX512-BF16)" : "off (no AVX512-BF16 on this CPU)");
  expect_batched_equals_alone(*sched, 150, 24, seven_others(), 3, 10);
}

TEST_F(SchedulerTest, ConcurrentSequencesMatchTheirSoloRuns) {
  // Would fail if KDA slots or MLA pages were mixed up between sequences.
  auto sched = make();
  std::vector<Collected> solo;
  for (int i = 0; i < 4; ++i) solo.push_back(run_alone(*sched, prompt(40 + 17 * i, 10 + i), 12));
  std::vector<std::unique_ptr<Client>> cs;
  for (int i = 0; i < 4; ++i) {
    cs.push_back(std::make_unique<Client>());
    ASSERT_TRUE(sched->submit(cs.back()->make(prompt(40 + 17 * i, 10 + i), 12)));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cs[static_cast<size_t>(i)]->wait().tokens, solo[static_cast<size_t>(i)].tokens) << i;
  EXPECT_NE(solo[0].tokens, solo[1].tokens);
}

TEST_F(SchedulerTest, PreemptionByRecomputeKeepsOutputs) {
  SchedulerConfig c;
  c.max_context = 256;
  c.cache.page_tokens = 16;
  // 4 slots and 22 pages of 16 tokens (352 tokens): two 150+40-token requests outgrow it while
  // decoding, so the younger one is preempted and recomputed.
  const auto& g = engine_->model().cache_geometry();
  const int64_t block = static_cast<int64_t>(g.mla_layers.size()) * 16 * g.mla_row_floats * 4;
  c.cache.max_slots = 4;
  c.cache.budget_bytes = g.slot_floats() * 4 * 4 + block * 22 + block / 2;
  auto sched = make(c);
  std::vector<Collected> solo;
  for (int i = 0; i < 3; ++i) solo.push_back(run_alone(*sched, prompt(150, 20 + i), 40));
  std::vector<std::unique_ptr<Client>> cs;
  for (int i = 0; i < 3; ++i) {
    cs.push_back(std::make_unique<Client>());
    ASSERT_TRUE(sched->submit(cs.back()->make(prompt(150, 20 + i), 40)));
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cs[static_cast<size_t>(i)]->wait().tokens, solo[static_cast<size_t>(i)].tokens);
  EXPECT_GT(sched->stats().preemptions_total, 0);
  EXPECT_EQ(sched->stats().kv_blocks_used, 0);
}

TEST_F(SchedulerTest, CancelFreesSlotAndPages) {
  auto sched = make();
  Client c;
  auto id = sched->submit(c.make(prompt(60, 1), 3000));
  ASSERT_TRUE(id);
  while (c.tokens_so_far() < 3) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(sched->stats().state_slots_used, 1);
  sched->cancel(*id);
  EXPECT_EQ(c.wait().finish, FinishReason::kCancelled);
  for (int i = 0; i < 100 && sched->stats().state_slots_used != 0; ++i) std::this_thread::sleep_for(2ms);
  EXPECT_EQ(sched->stats().state_slots_used, 0);
  EXPECT_EQ(sched->stats().kv_blocks_used, 0);
  EXPECT_EQ(sched->stats().cancelled_total, 1);
}

TEST_F(SchedulerTest, TimeoutFinishesRequest) {
  auto sched = make();
  Client c;
  auto r = c.make(prompt(30, 2), 3000);
  r.deadline = std::chrono::steady_clock::now() + 100ms;
  ASSERT_TRUE(sched->submit(std::move(r)));
  EXPECT_EQ(c.wait().finish, FinishReason::kTimeout);
}

TEST_F(SchedulerTest, WaitingQueueIsBounded) {
  SchedulerConfig c;
  c.max_waiting = 2;
  c.cache.max_slots = 1;
  auto sched = make(c);
  std::vector<std::unique_ptr<Client>> cs;
  int rejected = 0;
  for (int i = 0; i < 8; ++i) {
    cs.push_back(std::make_unique<Client>());
    auto r = sched->submit(cs.back()->make(prompt(10, i), 200));
    if (!r) {
      EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
      ++rejected;
      cs.pop_back();
    }
  }
  EXPECT_GT(rejected, 0);
  sched->drain(50ms);  // cancels the rest
  for (auto& x : cs) EXPECT_NE(x->wait().finish, FinishReason::kNone);
}

TEST_F(SchedulerTest, StopTokenAndLength) {
  auto sched = make();
  const Collected a = run_alone(*sched, prompt(30, 3), 8);
  ASSERT_EQ(a.tokens.size(), 8u);
  EXPECT_EQ(a.finish, FinishReason::kLength);
  Client c;
  auto r = c.make(prompt(30, 3), 8);
  r.params.stop_token_ids = {a.tokens[3]};
  ASSERT_TRUE(sched->submit(std::move(r)));
  const Collected b = c.wait();
  EXPECT_EQ(b.finish, FinishReason::kStop);
  EXPECT_EQ(b.tokens, std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + 4));
}

TEST_F(SchedulerTest, RejectsBadRequests) {
  SchedulerConfig c;
  c.max_context = 64;
  auto sched = make(c);
  Client x;
  EXPECT_EQ(sched->submit(x.make({}, 4)).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->submit(x.make(prompt(64, 1), 4)).error().code(), StatusCode::kTooLarge);
  EXPECT_EQ(sched->submit(x.make({1, 99999}, 4)).error().code(), StatusCode::kInvalidArgument);
}

// GGUF files from llama.cpp's converter (K3 micro, Q4_0; gpt-oss micro, MXFP4 experts by llama-quantize
// MXFP4_MOE): the default mode, int8 products with Q8_0 activations where the CPU has AVX-512 VNNI or AVX2,
// else the exact fp32 path (printed).
TEST(SchedulerGguf, BatchedEqualsAloneBitwise) {
  std::printf("GGUF int8 mode: %s\n", kernels::gguf_int8_applies(kernels::WeightMatrix{kernels::WeightFormat::kGgufQ8_0})
                                         ? "on" : "off (neither AVX-512 VNNI nor AVX2: exact path)");
  for (const char* file : {"k3_micro_q4_0.gguf", "gptoss_micro_mxfp4.gguf"}) {
    SCOPED_TRACE(file);
    auto e = Engine::load(std::string(KESTREL_TEST_DATA) + "/gguf/" + file);
    ASSERT_TRUE(e) << e.error().message();
    SchedulerConfig c;
    c.cache.budget_bytes = 64ll << 20;
    auto s = Scheduler::create(**e, c);
    ASSERT_TRUE(s) << s.error().message();
    expect_batched_equals_alone(**s, 150, 24, seven_others(), 3, 10);
  }
}

// The same on deepseek2 GGUFs (Q4_0 by llama_model_quantize): MLA pages only. DeepSeek V3 structure, and
// DeepSeek-V2-Lite structure (the query from one attn_q matrix, softmax greedy routing).
TEST(SchedulerGguf, Deepseek2BatchedEqualsAloneBitwise) {
  for (const char* file : {"deepseek_v3_micro_q4_0.gguf", "deepseek_v2_lite_micro_q4_0.gguf"}) {
    SCOPED_TRACE(file);
    auto e = Engine::load(std::string(KESTREL_TEST_DATA) + "/gguf/" + file);
    ASSERT_TRUE(e) << e.error().message();
    SchedulerConfig c;
    c.cache.budget_bytes = 64ll << 20;
    auto s = Scheduler::create(**e, c);
    ASSERT_TRUE(s) << s.error().message();
    expect_batched_equals_alone(**s, 150, 24, seven_others(), 3, 10);
  }
}

// DeepSeek through the scheduler: pool-backed MLA pages with no KDA slots (slot size 0), batched
// requests equal their solo runs bitwise. Also V3.2 with top-8 DSA (every layer sparse, indexer keys
// in their own pool pages) on prompts of 45..90 tokens, so the selection is really sparse. And Qwen3-MoE, whose
// GQA [k | v] rows live in the same pool pages.
TEST(SchedulerDeepseek, BatchedEqualsAlone) {
  for (const char* preset : {"deepseek-v3-tiny", "deepseek-v32-sparse-tiny", "qwen3moe-micro-bf16"}) {
    SCOPED_TRACE(preset);
    testing::TempDir dir;
    testing::make_checkpoint(preset, dir.path());
    auto e = Engine::load(dir.path());
    ASSERT_TRUE(e) << e.error().message();
    SchedulerConfig c;
    c.cache.budget_bytes = 64ll << 20;
    auto s = Scheduler::create(**e, c);
    ASSERT_TRUE(s) << s.error().message();
    expect_batched_equals_alone(**s, 90, 12, {{45, 7, 0.0f}, {70, 8, 0.0f}, {95, 9, 0.0f}}, 2, 4);
  }
}

}  // namespace
}  // namespace kestrel
