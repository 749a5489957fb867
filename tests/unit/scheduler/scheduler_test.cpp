// Scheduler and cache pools on a real tiny model: batching must not change results (bitwise),
// sequences never see each other's KDA slots or MLA pages, cancellation/timeouts free resources,
// preemption by recompute keeps outputs identical, the waiting queue is bounded.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "common/test_util.h"
#include "scheduler/scheduler.h"

namespace kestrel {
namespace {

using namespace std::chrono_literals;

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> tops;
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

TEST_F(SchedulerTest, BatchedEqualsAloneBitwise) {
  auto sched = make();
  const Collected alone = run_alone(*sched, prompt(150, 0), 24);
  ASSERT_EQ(alone.tokens.size(), 24u);
  // Same request amid 7 others with different prompts and lengths, submitted together.
  std::vector<std::unique_ptr<Client>> others;
  Client target;
  for (int i = 1; i <= 7; ++i) {
    others.push_back(std::make_unique<Client>());
    ASSERT_TRUE(sched->submit(others.back()->make(prompt(20 + 30 * i, i), 10 + i, i % 2 ? 0.8f : 0.0f)));
    if (i == 3) {
      ASSERT_TRUE(sched->submit(target.make(prompt(150, 0), 24)));
    }
  }
  const Collected batched = target.wait();
  for (auto& o : others) EXPECT_EQ(o->wait().finish, FinishReason::kLength);
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

// DeepSeek through the scheduler: pool-backed MLA pages with no KDA slots (slot size 0), batched
// requests equal their solo runs bitwise. Also V3.2 with top-8 DSA (every layer sparse, indexer keys
// in their own pool pages) on prompts of 45..90 tokens, so the selection is really sparse.
TEST(SchedulerDeepseek, BatchedEqualsAlone) {
  for (const char* preset : {"deepseek-v3-tiny", "deepseek-v32-sparse-tiny"}) {
    SCOPED_TRACE(preset);
    testing::TempDir dir;
    testing::make_checkpoint(preset, dir.path());
    auto e = Engine::load(dir.path());
    ASSERT_TRUE(e) << e.error().message();
    SchedulerConfig c;
    c.cache.budget_bytes = 64ll << 20;
    auto s = Scheduler::create(**e, c);
    ASSERT_TRUE(s) << s.error().message();
    const Collected alone = run_alone(**s, prompt(90, 0), 12);
    ASSERT_EQ(alone.tokens.size(), 12u);
    std::vector<std::unique_ptr<Client>> others;
    Client target;
    for (int i = 1; i <= 3; ++i) {
      others.push_back(std::make_unique<Client>());
      ASSERT_TRUE((*s)->submit(others.back()->make(prompt(20 + 25 * i, i), 6 + i)));
      if (i == 2) {
        ASSERT_TRUE((*s)->submit(target.make(prompt(90, 0), 12)));
      }
    }
    const Collected batched = target.wait();
    for (auto& o : others) EXPECT_EQ(o->wait().finish, FinishReason::kLength);
    EXPECT_EQ(batched.tokens, alone.tokens);
    EXPECT_EQ(batched.logprobs, alone.logprobs);
  }
}

}  // namespace
}  // namespace kestrel
