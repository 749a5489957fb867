// The scheduler as rank 0 of a cell (ranks as threads on the in-process communicator), attention data parallel:
// concurrent requests spread over every rank's pools and give the tokens, logprobs and top logprobs of the same
// scheduler in one process, bit for bit; after finish, cancel and preemption no rank holds a slot or page; stopping
// the scheduler ends the followers' loop. A follower refuses a plan whose slot or pages are not free in its own
// pools. A cell step that fails (a rank that never takes part) fails every request with the error, and the
// scheduler then refuses work, is not ready and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

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

// n requests submitted together (batched), their outcomes in submission order.
std::vector<Outcome> serve_n(Scheduler& s, int n) {
  std::vector<Request> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_TRUE(s.submit(reqs[static_cast<size_t>(i)].make(i)));
  std::vector<Outcome> out;
  for (auto& r : reqs) out.push_back(r.wait());
  return out;
}
std::vector<Outcome> serve_three(Scheduler& s) { return serve_n(s, 3); }

void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& alone, int ranks) {
  ASSERT_EQ(got.size(), alone.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].finish, FinishReason::kLength) << got[i].error;
    EXPECT_EQ(got[i].tokens, alone[i].tokens) << ranks << " ranks, request " << i;
    EXPECT_EQ(got[i].logprobs, alone[i].logprobs) << ranks << " ranks, request " << i;  // exact floats
    ASSERT_EQ(got[i].tops.size(), alone[i].tops.size());
    for (size_t t = 0; t < got[i].tops.size(); ++t) {
      ASSERT_EQ(got[i].tops[t].size(), alone[i].tops[t].size());
      for (size_t k = 0; k < got[i].tops[t].size(); ++k) {
        EXPECT_EQ(got[i].tops[t][k].id, alone[i].tops[t][k].id);
        EXPECT_EQ(got[i].tops[t][k].logprob, alone[i].tops[t][k].logprob);
      }
    }
  }
}

// A follower's own pools (configured as rank 0's ledger for it); after the cell stops every slot and page is free
// and it held at least one sequence of its own.
void follow_with_pools(Cell& cell, const Model& model, const SchedulerConfig& cfg) {
  auto pools = CachePools::create(model.cache_geometry(), Scheduler::pool_config(cfg));
  ASSERT_TRUE(pools) << pools.error().message();
  cell.hold_in(**pools);
  const Status st = cell.follow();  // returns once rank 0's scheduler stops
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_GE(cell.pooled_started(), 1) << "rank " << cell.rank() << " held no sequence";
  EXPECT_EQ(cell.held_sequences(), 0u) << "rank " << cell.rank();
  EXPECT_EQ((*pools)->free_slots(), (*pools)->num_slots()) << "rank " << cell.rank() << " leaked a slot";
  EXPECT_EQ((*pools)->free_blocks(), (*pools)->num_blocks()) << "rank " << cell.rank() << " leaked a page";
}

void expect_rank0_empty(Scheduler& s) {
  const ServiceStats st = s.stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  for (int64_t n : st.rank_sequences) EXPECT_EQ(n, 0);
  for (int64_t n : st.rank_kv_blocks_used) EXPECT_EQ(n, 0);
}

TEST(SchedulerCell, RequestsSpreadOverEveryRankAndGiveWhatOneProcessGives) {
  testing::TempDir dir;
  testing::make_checkpoint("k3-tiny", dir.path());
  constexpr int kRequests = 8;
  std::vector<Outcome> alone;
  {
    auto e = Engine::load(dir.path());
    ASSERT_TRUE(e) << e.error().message();
    auto s = Scheduler::create(**e, config());
    ASSERT_TRUE(s) << s.error().message();
    alone = serve_n(**s, kRequests);
    (*s)->drain(5s);
  }
  for (const Outcome& o : alone) ASSERT_EQ(o.finish, FinishReason::kLength);
  for (int ranks : {2, 4}) {
    dist::run_fake_ranks(ranks, [&](dist::Communicator& c) {
      ExpertShard shard{&c, c.rank(), c.size(), {}};
      auto e = Engine::load(dir.path(), &shard);
      ASSERT_TRUE(e) << e.error().message();
      Cell cell((*e)->model(), c);
      if (c.rank() != 0) return follow_with_pools(cell, (*e)->model(), config());
      auto s = Scheduler::create(**e, config(), &cell);
      ASSERT_TRUE(s) << s.error().message();
      const ServiceStats before = (*s)->stats();
      EXPECT_EQ(before.state_slots_total, 4 * ranks);  // every rank's slots
      ASSERT_EQ(before.rank_sequences.size(), static_cast<size_t>(ranks));
      EXPECT_GT(before.rank_cache_bytes, 0);
      // The most sequences each rank held at once, from the scheduler's stats while the requests run.
      std::vector<int64_t> most(static_cast<size_t>(ranks), 0);
      std::atomic<bool> done{false};
      std::thread watch([&] {
        while (!done) {
          const ServiceStats st = (*s)->stats();
          for (size_t r = 0; r < most.size(); ++r) most[r] = std::max(most[r], st.rank_sequences[r]);
          std::this_thread::sleep_for(1ms);
        }
      });
      const std::vector<Outcome> got = serve_n(**s, kRequests);
      done = true;
      watch.join();
      for (int r = 0; r < ranks; ++r) EXPECT_GE(most[static_cast<size_t>(r)], 1) << "rank " << r << " held no sequence";
      (*s)->drain(5s);
      EXPECT_TRUE((*s)->failure().empty());
      EXPECT_GT(cell.traffic().steps, 0u);
      expect_same(got, alone, ranks);
      expect_rank0_empty(**s);
    });
  }
}

TEST(SchedulerCell, CancelAndPreemptionFreeEveryRanksSlotsAndPages) {
  testing::TempDir dir;
  testing::make_checkpoint("k3-tiny", dir.path());
  // Per rank 4 slots and 22 pages of 16 tokens: three 150+40-token requests on a rank outgrow it while decoding,
  // so that rank preempts its youngest and recomputes it (as scheduler_test's preemption test, per rank).
  SchedulerConfig cfg = config();
  {
    auto e = Engine::load(dir.path());
    ASSERT_TRUE(e) << e.error().message();
    const auto& g = (*e)->model().cache_geometry();
    const int64_t block = static_cast<int64_t>(g.mla_layers.size()) * 16 * g.mla_row_floats * 4;
    cfg.cache.page_tokens = 16;
    cfg.cache.budget_bytes = g.slot_floats() * 4 * 4 + block * 22 + block / 2;
  }
  auto make = [](Request& r, int i) {
    GenerationRequest g = r.make(0);
    g.prompt.clear();
    for (int k = 0; k < 150; ++k) g.prompt.push_back((k * 37 + (20 + i) * 101 + 5) % 500);
    g.params.max_new_tokens = 40;
    return g;
  };
  std::vector<Outcome> alone;
  {
    auto e = Engine::load(dir.path());
    ASSERT_TRUE(e) << e.error().message();
    auto s = Scheduler::create(**e, cfg);
    ASSERT_TRUE(s) << s.error().message();
    for (int i = 0; i < 6; ++i) {  // one at a time: nothing to preempt
      Request r;
      ASSERT_TRUE((*s)->submit(make(r, i)));
      alone.push_back(r.wait());
    }
    (*s)->drain(5s);
  }
  dist::run_fake_ranks(2, [&](dist::Communicator& c) {
    ExpertShard shard{&c, c.rank(), c.size(), {}};
    auto e = Engine::load(dir.path(), &shard);
    ASSERT_TRUE(e) << e.error().message();
    Cell cell((*e)->model(), c);
    if (c.rank() != 0) return follow_with_pools(cell, (*e)->model(), cfg);
    auto s = Scheduler::create(**e, cfg, &cell);
    ASSERT_TRUE(s) << s.error().message();
    // Cancel: two long requests (one per rank) cancelled mid-generation.
    {
      std::vector<Request> longs(2);
      std::vector<uint64_t> ids;
      for (auto& r : longs) {
        GenerationRequest g = r.make(1);
        g.params.max_new_tokens = 3000;
        auto id = (*s)->submit(std::move(g));
        ASSERT_TRUE(id);
        ids.push_back(*id);
      }
      for (int i = 0; i < 2000 && (*s)->stats().generation_tokens_total < 6; ++i) std::this_thread::sleep_for(5ms);
      EXPECT_EQ((*s)->stats().rank_sequences, (std::vector<int64_t>{1, 1}));
      for (uint64_t id : ids) (*s)->cancel(id);
      for (auto& r : longs) EXPECT_EQ(r.wait().finish, FinishReason::kCancelled);
      for (int i = 0; i < 200 && (*s)->stats().state_slots_used != 0; ++i) std::this_thread::sleep_for(5ms);
      expect_rank0_empty(**s);
    }
    // Preemption: six requests together, three per rank.
    std::vector<Request> reqs(6);
    for (int i = 0; i < 6; ++i) ASSERT_TRUE((*s)->submit(make(reqs[static_cast<size_t>(i)], i)));
    for (int i = 0; i < 6; ++i) {
      const Outcome o = reqs[static_cast<size_t>(i)].wait();
      EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
      EXPECT_EQ(o.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
    }
    EXPECT_GT((*s)->stats().preemptions_total, 0);
    (*s)->drain(5s);
    EXPECT_TRUE((*s)->failure().empty()) << (*s)->failure();
    expect_rank0_empty(**s);
  });
}

// The ledger on rank 0 and a follower's pools must agree: the ledger hands out slots and pages as the pools do,
// and a follower's pools refuse a slot or page that is not free there (Cell then ends the follower with the reason
// instead of computing over another sequence's state).
TEST(SchedulerCell, LedgerAndFollowerPoolsAgreeAndTakenMemoryIsRefused) {
  testing::TempDir dir;
  testing::make_checkpoint("k3-tiny", dir.path());
  auto e = Engine::load(dir.path());
  ASSERT_TRUE(e) << e.error().message();
  const CacheGeometry& g = (*e)->model().cache_geometry();
  auto ledger = CachePools::create_ledger(g, Scheduler::pool_config(config()));
  auto pools = CachePools::create(g, Scheduler::pool_config(config()));
  ASSERT_TRUE(ledger && pools);
  EXPECT_TRUE((*ledger)->is_ledger());
  EXPECT_EQ((*ledger)->num_slots(), (*pools)->num_slots());
  EXPECT_EQ((*ledger)->num_blocks(), (*pools)->num_blocks());
  EXPECT_EQ((*ledger)->arena_bytes(), (*pools)->arena_bytes());
  SequenceState a_led, a;
  std::vector<int32_t> a_led_blocks, a_blocks;
  const int slot = *(*ledger)->acquire_slot(a_led);
  ASSERT_TRUE((*ledger)->grow(a_led, a_led_blocks, 100));
  EXPECT_TRUE(a_led.kda.empty() && a_led.mla.empty());  // bookkeeping only: no views into memory it lacks
  ASSERT_TRUE((*pools)->take_slot(a, slot));
  ASSERT_TRUE((*pools)->take_blocks(a, a_blocks, a_led_blocks));
  EXPECT_EQ(a_blocks, a_led_blocks);
  EXPECT_EQ((*pools)->free_blocks(), (*ledger)->free_blocks());
  EXPECT_EQ((*pools)->free_slots(), (*ledger)->free_slots());
  // The slot's state is zeroed and is the pools' own memory.
  for (int l : g.kda_layers) {
    const KdaState& k = a.kda[static_cast<size_t>(l)];
    EXPECT_GE(k.recurrent, (*pools)->slot_data(slot));
    EXPECT_LT(k.recurrent, (*pools)->slot_data(slot) + (*pools)->slot_floats());
  }
  SequenceState b;
  std::vector<int32_t> b_blocks;
  EXPECT_FALSE((*pools)->take_slot(b, slot));  // taken
  const int other = slot == 0 ? 1 : 0;
  ASSERT_TRUE((*pools)->take_slot(b, other));
  EXPECT_FALSE((*pools)->take_blocks(b, b_blocks, std::vector<int32_t>{a_blocks[0]}));  // a's page
  const int32_t free_block = (*ledger)->alloc_block();
  EXPECT_FALSE((*pools)->take_blocks(b, b_blocks, std::vector<int32_t>{free_block, free_block}));  // twice
  EXPECT_TRUE(b_blocks.empty());  // a refused call changes nothing
  EXPECT_FALSE((*pools)->take_blocks(b, b_blocks, std::vector<int32_t>{static_cast<int32_t>((*pools)->num_blocks())}));
  ASSERT_TRUE((*pools)->take_blocks(b, b_blocks, std::vector<int32_t>{free_block}));
  (*pools)->release(a, slot, a_blocks);
  (*pools)->release(b, other, b_blocks);
  EXPECT_EQ((*pools)->free_blocks(), (*pools)->num_blocks());
  EXPECT_EQ((*pools)->free_slots(), (*pools)->num_slots());
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
