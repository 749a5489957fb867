// The scheduler as rank 0 of a cell (ranks as threads on the in-process communicator): concurrent requests give
// the tokens and logprobs of the same scheduler in one process, bit for bit, and stopping the scheduler ends the
// followers' loop; a cell step that fails (a rank that never takes part) fails every request with the error,
// and the scheduler then refuses work, is not ready and says why.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "common/test_util.h"
#include "dist/fake_communicator.h"
#include "scheduler/scheduler.h"

namespace kestrel {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> tops;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

// One request's events; wait() returns them once the final event came.
class Request {
 public:
  GenerationRequest make(int salt) {
    GenerationRequest r;
    for (int i = 0; i < 19 + 5 * salt; ++i) r.prompt.push_back((i * 37 + salt * 101 + 5) % 500);
    r.params.temperature = 0.0f;
    r.params.max_new_tokens = 8;
    r.params.top_logprobs = 5;
    r.params.seed = 3, r.params.has_seed = true;
    r.on_event = [this](const GenerationEvent& e) {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.finish == FinishReason::kNone) {
        out_.tokens.push_back(e.token), out_.logprobs.push_back(e.logprob), out_.tops.push_back(e.top);
        return;
      }
      out_.finish = e.finish, out_.error = e.error, done_ = true;
      cv_.notify_all();
    };
    return r;
  }
  Outcome wait() {
    std::unique_lock<std::mutex> lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, 120s, [&] { return done_; })) << "request did not finish";
    return out_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Outcome out_;
  bool done_ = false;
};

SchedulerConfig config() {
  SchedulerConfig c;
  c.max_context = 256;
  c.prefill_chunk = 16;
  c.max_batch_tokens = 64;
  c.cache.budget_bytes = 64ll << 20;
  c.cache.max_slots = 4;
  return c;
}

// Three requests submitted together (batched), their outcomes in submission order.
std::vector<Outcome> serve_three(Scheduler& s) {
  std::vector<Request> reqs(3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.submit(reqs[static_cast<size_t>(i)].make(i)));
  std::vector<Outcome> out;
  for (auto& r : reqs) out.push_back(r.wait());
  return out;
}

TEST(SchedulerCell, RankZeroServesWhatOneProcessServesAndStopsTheFollowers) {
  testing::TempDir dir;
  testing::make_checkpoint("k3-tiny", dir.path());
  std::vector<Outcome> alone;
  {
    auto e = Engine::load(dir.path());
    ASSERT_TRUE(e) << e.error().message();
    auto s = Scheduler::create(**e, config());
    ASSERT_TRUE(s) << s.error().message();
    alone = serve_three(**s);
    (*s)->drain(5s);
  }
  for (const Outcome& o : alone) ASSERT_EQ(o.finish, FinishReason::kLength);
  for (int ranks : {2, 4}) {
    dist::run_fake_ranks(ranks, [&](dist::Communicator& c) {
      ExpertShard shard{&c, c.rank(), c.size(), {}};
      auto e = Engine::load(dir.path(), &shard);
      ASSERT_TRUE(e) << e.error().message();
      Cell cell((*e)->model(), c);
      if (c.rank() != 0) {
        EXPECT_TRUE(cell.follow().is_ok());  // returns once rank 0's scheduler stops
        EXPECT_EQ(cell.held_sequences(), 0u);  // every request's state lived on rank 0
        return;
      }
      auto s = Scheduler::create(**e, config(), &cell);
      ASSERT_TRUE(s) << s.error().message();
      const std::vector<Outcome> got = serve_three(**s);
      (*s)->drain(5s);
      EXPECT_TRUE((*s)->failure().empty());
      EXPECT_GT(cell.traffic().steps, 0u);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].finish, FinishReason::kLength) << got[i].error;
        EXPECT_EQ(got[i].tokens, alone[i].tokens) << ranks << " ranks, request " << i;
        EXPECT_EQ(got[i].logprobs, alone[i].logprobs) << ranks << " ranks, request " << i;  // exact floats
        ASSERT_EQ(got[i].tops.size(), alone[i].tops.size());
        for (size_t t = 0; t < got[i].tops.size(); ++t)
          for (size_t k = 0; k < got[i].tops[t].size(); ++k) {
            EXPECT_EQ(got[i].tops[t][k].id, alone[i].tops[t][k].id);
            EXPECT_EQ(got[i].tops[t][k].logprob, alone[i].tops[t][k].logprob);
          }
      }
    });
  }
}

TEST(SchedulerCell, AFailedCellStepFailsEveryRequestAndTheSchedulerSaysWhy) {
  testing::TempDir dir;
  testing::make_checkpoint("k3-tiny", dir.path());
  dist::FakeHub::Options quick;
  quick.timeout = 300ms;  // rank 1 never joins a step: rank 0's plan broadcast fails after this
  dist::run_fake_ranks(2, [&](dist::Communicator& c) {
    if (c.rank() != 0) return;
    ExpertShard shard{&c, c.rank(), c.size(), {}};
    auto e = Engine::load(dir.path(), &shard);
    ASSERT_TRUE(e) << e.error().message();
    Cell cell((*e)->model(), c);
    auto s = Scheduler::create(**e, config(), &cell);
    ASSERT_TRUE(s) << s.error().message();
    EXPECT_TRUE((*s)->ready());
    const std::vector<Outcome> got = serve_three(**s);
    for (const Outcome& o : got) {
      EXPECT_EQ(o.finish, FinishReason::kError);
      EXPECT_NE(o.error.find("the cell failed"), std::string::npos) << o.error;
    }
    EXPECT_FALSE((*s)->ready());
    EXPECT_NE((*s)->failure().find("the cell failed"), std::string::npos) << (*s)->failure();
    Request late;
    auto r = (*s)->submit(late.make(0));
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find("the cell failed"), std::string::npos) << r.error().message();
    (*s)->drain(1s);
  }, quick);
}

}  // namespace
}  // namespace kestrel
