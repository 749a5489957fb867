// The prefix cache through the scheduler on real tiny models (K3, K3 with DSA layers, Kimi Linear,
// DeepSeek V3, DeepSeek V3.2 sparse): a warm request (prefix hit) must give the cache-off run's tokens and
// log-probabilities bit for bit (hits sit on the prefill chunk grid, docs/architecture.md), cached_tokens
// must say what was reused, salts must separate, and nothing may leak. Injected snapshot faults (zeroed,
// one block stale, one token late) must change the output: the KDA snapshot really carries the state.
#include <gtest/gtest.h>

#include "common/scheduler_client.h"
#include "common/test_util.h"
#include "scheduler/scheduler.h"

namespace kestrel {
namespace {

using testing::Client;
using testing::Collected;

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101 + 5) % 500);
  return p;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

constexpr int64_t kPage = 16, kChunk = 32;

SchedulerConfig config(bool prefix, SnapshotFault fault = SnapshotFault::kNone) {
  SchedulerConfig c;
  c.cache.budget_bytes = 64ll << 20;
  c.cache.page_tokens = kPage;
  c.cache.max_slots = 8;
  c.prefill_chunk = kChunk;
  c.max_batch_tokens = 64;
  c.max_context = 1024;
  c.prefix_cache = prefix;
  c.prefix.snapshot_budget_bytes = 16ll << 20;
  c.prefix.fault = fault;
  c.cache_fingerprint = "test-model";
  return c;
}

void expect_same(const Collected& a, const Collected& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_EQ(a.logprobs[i], b.logprobs[i]) << what << " token " << i;  // bitwise
    ASSERT_EQ(a.tops[i].size(), b.tops[i].size()) << what;
    for (size_t j = 0; j < a.tops[i].size(); ++j) {
      EXPECT_EQ(a.tops[i][j].id, b.tops[i][j].id) << what;
      EXPECT_EQ(a.tops[i][j].logprob, b.tops[i][j].logprob) << what;
    }
  }
}

bool differs(const Collected& a, const Collected& b) {
  if (a.tokens != b.tokens || a.logprobs.size() != b.logprobs.size()) return true;
  for (size_t i = 0; i < a.logprobs.size(); ++i)
    if (a.logprobs[i] != b.logprobs[i]) return true;
  return false;
}

Collected run(Scheduler& s, std::vector<int32_t> p, int n, const std::string& salt = "") {
  Client c;
  GenerationRequest r = c.make(std::move(p), n);
  r.cache_salt = salt;
  EXPECT_TRUE(s.submit(std::move(r)));
  return c.wait();
}

// Waits until the scheduler thread has published its final counters.
ServiceStats settled(Scheduler& s) {
  for (int i = 0; i < 200; ++i) {
    ServiceStats st = s.stats();
    if (st.running == 0 && st.waiting == 0) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s.stats();
}

class PrefixScheduler : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing::TempDir>();
    testing::make_checkpoint(GetParam(), dir_->path());
    auto e = Engine::load(dir_->path());
    ASSERT_TRUE(e) << e.error().message();
    engine_ = std::move(*e);
  }
  std::unique_ptr<Scheduler> make(const SchedulerConfig& c) {
    auto s = Scheduler::create(*engine_, c);
    EXPECT_TRUE(s) << s.error().message();
    return std::move(*s);
  }
  bool hybrid() const { return !engine_->model().cache_geometry().kda_layers.empty(); }

  // A multi-turn conversation: each turn's prompt = the previous prompt + its answer + a new user part.
  // Returns every turn's result.
  std::vector<Collected> conversation(Scheduler& s, int turns, const std::string& salt = "") {
    std::vector<Collected> out;
    std::vector<int32_t> history = tokens(70, 1);
    for (int t = 0; t < turns; ++t) {
      out.push_back(run(s, history, 6, salt));
      history = cat(cat(history, out.back().tokens), tokens(23 + 9 * t, 10 + t));
    }
    return out;
  }

  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(PrefixScheduler, MultiTurnWarmEqualsCacheOffBitwise) {
  std::vector<Collected> off;
  {
    auto s = make(config(false));
    off = conversation(*s, 6);
  }
  auto s = make(config(true));
  const std::vector<Collected> on = conversation(*s, 6);
  ASSERT_EQ(on.size(), off.size());
  int last = -1;
  for (size_t t = 0; t < on.size(); ++t) {
    expect_same(on[t], off[t], "turn " + std::to_string(t));
    EXPECT_EQ(on[t].cached_tokens % kChunk, 0) << "hits sit on the chunk grid";
    EXPECT_LT(on[t].cached_tokens, on[t].prompt_tokens) << "at least one prompt token is computed";
    if (t == 0) EXPECT_EQ(on[t].cached_tokens, 0);
    else EXPECT_GT(on[t].cached_tokens, last) << "turn " << t << ": the cached prefix grows";
    last = on[t].cached_tokens;
  }
  const ServiceStats st = settled(*s);
  EXPECT_TRUE(st.prefix_cache);
  EXPECT_EQ(st.prefix.queries, 6);
  EXPECT_GT(st.prefix.hit_tokens, 0);
  EXPECT_GT(st.prefix.cached_blocks, 0);
  EXPECT_EQ(st.prefix.snapshots > 0, hybrid());
}

// bf16 pages: a warm request reads blocks an earlier request wrote in the same dtype and runs the same
// arithmetic on them, so it equals the bf16 cache-off run bit for bit too.
TEST_P(PrefixScheduler, Bf16PagesWarmEqualsCacheOffBitwise) {
  auto bf16 = [](SchedulerConfig c) {
    c.cache.kv_dtype = KvCacheDtype::kBF16;
    return c;
  };
  std::vector<Collected> off;
  {
    auto s = make(bf16(config(false)));
    off = conversation(*s, 4);
  }
  auto s = make(bf16(config(true)));
  const std::vector<Collected> on = conversation(*s, 4);
  ASSERT_EQ(on.size(), off.size());
  for (size_t t = 0; t < on.size(); ++t) expect_same(on[t], off[t], "bf16 turn " + std::to_string(t));
  EXPECT_GT(on.back().cached_tokens, 0);
  EXPECT_GT(settled(*s).prefix.hit_tokens, 0);
}

TEST_P(PrefixScheduler, HitCasesEqualCacheOff) {
  // Grid 32, blocks of 16. Cases: the same prompt again (whole prompt cached: the last chunk is
  // recomputed), one token more and one token less than a grid boundary, exactly on the grid, a prompt
  // shorter than one block, and a branch off a cached prefix seen three times (the branch point becomes a
  // snapshot on its second sighting).
  const std::vector<int32_t> base = tokens(100, 2), x = tokens(140, 11);
  const std::vector<std::vector<int32_t>> cases = {
      base,                                                    // 0: cold
      base,                                                    // 1: again
      std::vector<int32_t>(base.begin(), base.begin() + 97),  // 2: grid 96 + 1
      std::vector<int32_t>(base.begin(), base.begin() + 95),  // 3: grid 96 - 1
      std::vector<int32_t>(base.begin(), base.begin() + 64),  // 4: exactly on the grid
      tokens(9, 3),                                            // 5: shorter than one block
      cat(x, tokens(30, 4)),                                   // 6: X + A
      cat(x, tokens(30, 5)),                                   // 7: X + B, branch at 140 (pages to 128)
      cat(x, tokens(30, 6)),                                   // 8: X + C
  };
  std::vector<Collected> off, on;
  {
    auto s = make(config(false));
    for (const auto& c : cases) off.push_back(run(*s, c, 5));
  }
  auto s = make(config(true));
  for (const auto& c : cases) on.push_back(run(*s, c, 5));
  for (size_t i = 0; i < on.size(); ++i) expect_same(on[i], off[i], "case " + std::to_string(i));
  const bool h = hybrid();
  const std::vector<int> want = {0, 96, 96, h ? 0 : 64, h ? 0 : 32, 0, 0, h ? 0 : 128, 128};
  for (size_t i = 0; i < on.size(); ++i) EXPECT_EQ(on[i].cached_tokens, want[i]) << "case " << i;
  // Hybrid: case 3 (95 tokens) finds pages to 64 but no state there: it snapshots 64 for next time; case 7
  // finds X's pages to 128 without state (the snapshot of case 6 is at 160): branch point, snapshot at 128,
  // which case 8 uses.
}

TEST_P(PrefixScheduler, BlocksOfAShortLastChunkOrOfDecodeAreNeverReused) {
  // Grid 32, blocks of 16. A 60-token prompt runs chunks [0,32) and a short [32,60); 12 generated tokens fill
  // the block [48,64) in decode. Those blocks round differently from the whole chunk [32,64) a longer cold
  // prompt runs, so a follow-up that extends the first 64 tokens may reuse only the whole chunk [0,32).
  const auto first = tokens(60, 12);
  Collected off, on_first, on;
  {
    auto s = make(config(false));
    const Collected a = run(*s, first, 12);
    std::vector<int32_t> second(first);
    second.insert(second.end(), a.tokens.begin(), a.tokens.begin() + 4);
    off = run(*s, cat(second, tokens(40, 13)), 8);
  }
  auto s = make(config(true));
  on_first = run(*s, first, 12);
  std::vector<int32_t> second(first);
  second.insert(second.end(), on_first.tokens.begin(), on_first.tokens.begin() + 4);
  on = run(*s, cat(second, tokens(40, 13)), 8);
  expect_same(on, off, "follow-up over a short chunk and decode");
  EXPECT_EQ(on.cached_tokens, 32) << "only blocks computed in whole chunks are reused";
}

TEST_P(PrefixScheduler, SaltAndFingerprintSeparate) {
  auto s = make(config(true));
  const auto p = tokens(120, 6);
  EXPECT_EQ(run(*s, p, 3, "tenant-a").cached_tokens, 0);
  EXPECT_EQ(run(*s, p, 3, "tenant-b").cached_tokens, 0) << "another salt never shares";
  EXPECT_EQ(run(*s, p, 3, "tenant-a").cached_tokens, 96);
  EXPECT_EQ(run(*s, p, 3).cached_tokens, 0) << "no salt is a namespace of its own";
}

TEST_P(PrefixScheduler, NoLeaksUnderPressureAndFlush) {
  // A cache so small that stored prefixes are evicted while 12 requests over shared prefixes run; every
  // answer equals its cache-off answer; afterwards a flush returns every block and snapshot.
  SchedulerConfig c = config(true);
  SchedulerConfig c_off = config(false);
  const auto g = engine_->model().cache_geometry();
  const int64_t block = static_cast<int64_t>(g.mla_layers.size()) * kPage * g.mla_row_floats * 4 +
                        static_cast<int64_t>(g.sparse_layers.size()) * kPage * g.index_row_bytes;
  // On: 4 running sequences need at most 4 x 12 blocks, so 50 blocks never preempt but leave the cache only a
  // few blocks of its own. It wants ~48 distinct ones: only blocks computed in whole 32-token chunks are stored,
  // so each prompt's own tail (40+ tokens) spans at least one whole chunk (2 blocks) past its shared prefix.
  // Off: ample room (batching never changes a bit).
  c.cache.max_slots = 4;
  c.cache.budget_bytes = g.slot_floats() * 4 * c.cache.max_slots + block * 50;
  c.max_context = 50 * kPage;
  c.prefix.snapshot_budget_bytes = std::max<int64_t>(1, g.slot_floats() * 4 * 3);  // 3 snapshots
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    const auto shared = tokens(200, i % 3);
    prompts.push_back(cat(std::vector<int32_t>(shared.begin(), shared.begin() + 96 + 32 * (i % 2)), tokens(40 + i, 20 + i)));
  }
  auto go = [&](Scheduler& s) {
    std::vector<std::unique_ptr<Client>> cs;
    for (const auto& p : prompts) {
      cs.push_back(std::make_unique<Client>());
      EXPECT_TRUE(s.submit(cs.back()->make(p, 4)));
    }
    std::vector<Collected> r;
    for (auto& cl : cs) r.push_back(cl->wait());
    return r;
  };
  std::vector<Collected> off;
  {
    auto s = make(c_off);
    off = go(*s);
  }
  auto s = make(c);
  const auto on = go(*s);
  const auto on2 = go(*s);  // again, now with a warm (and pressured) cache
  for (size_t i = 0; i < on.size(); ++i) {
    EXPECT_EQ(on[i].finish, FinishReason::kLength);
    expect_same(on[i], off[i], "first pass " + std::to_string(i));
    expect_same(on2[i], off[i], "second pass " + std::to_string(i));
  }
  ServiceStats st = settled(*s);
  EXPECT_GT(st.prefix.hit_tokens, 0);
  EXPECT_GT(st.prefix.evicted_blocks, 0) << "the page budget forced evictions";
  if (hybrid()) {
    EXPECT_GT(st.prefix.evicted_snapshots, 0) << "the 3-snapshot budget forced evictions";
  }
  EXPECT_EQ(st.state_slots_used, 0);
  EXPECT_EQ(st.preemptions_total, 0);
  EXPECT_EQ(st.kv_blocks_used, st.prefix.cached_blocks) << "only the cache holds blocks when idle";
  s->flush_prefix_cache();
  for (int i = 0; i < 200 && s->stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  st = settled(*s);
  EXPECT_EQ(st.kv_blocks_used, 0) << "leaked blocks";
  EXPECT_EQ(st.prefix.cached_blocks, 0);
  EXPECT_EQ(st.prefix.snapshots, 0) << "leaked snapshots";
  EXPECT_EQ(st.state_slots_used, 0);
}

// Requests arriving together over a shared prefix: the later ones wait for the first prefill to pass the last
// common grid boundary and reuse what it stored there (4 shared chunks), instead of computing it side by side;
// a request with another salt shares nothing and never waits. Every answer equals its cache-off answer bit for
// bit; afterwards nothing leaks. Cancelling the prefill another request waits on never strands the waiter: it
// finishes with the bits of its run alone, wherever the cancel lands.
TEST_P(PrefixScheduler, RequestsArrivingTogetherShareOnePrefill) {
  const auto shared = tokens(4 * kChunk + 7, 3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(cat(shared, tokens(20 + 9 * i, 40 + i)));
  const std::vector<std::string> salts = {"", "", "other"};
  auto go = [&](Scheduler& s) {
    std::vector<std::unique_ptr<Client>> cs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      cs.push_back(std::make_unique<Client>());
      GenerationRequest r = cs.back()->make(prompts[i], 5);
      r.cache_salt = salts[i];
      EXPECT_TRUE(s.submit(std::move(r)));
    }
    std::vector<Collected> out;
    for (auto& c : cs) out.push_back(c->wait());
    return out;
  };
  std::vector<Collected> off;
  {
    auto s = make(config(false));
    off = go(*s);
  }
  auto s = make(config(true));
  const auto on = go(*s);
  for (size_t i = 0; i < on.size(); ++i) expect_same(on[i], off[i], "request " + std::to_string(i));
  EXPECT_EQ(on[0].cached_tokens, 0);
  EXPECT_EQ(on[1].cached_tokens, 4 * kChunk) << "the second request reuses the first one's prefill";
  EXPECT_EQ(on[2].cached_tokens, 0) << "another salt shares nothing";

  // Cancel the prefill another request waits on: the waiter runs alone.
  auto s2 = make(config(true));
  const auto long_shared = tokens(20 * kChunk, 5);
  Client a, b;
  GenerationRequest ra = a.make(cat(long_shared, tokens(9, 50)), 5), rb = b.make(cat(long_shared, tokens(11, 51)), 5);
  const auto ida = s2->submit(std::move(ra));
  ASSERT_TRUE(ida);
  ASSERT_TRUE(s2->submit(std::move(rb)));
  s2->cancel(*ida);
  const Collected ca = a.wait(), cb = b.wait();
  EXPECT_EQ(cb.finish, FinishReason::kLength);
  auto s3 = make(config(false));
  expect_same(cb, run(*s3, cat(long_shared, tokens(11, 51)), 5), "waiter after a cancelled prefill");
  for (Scheduler* x : {s.get(), s2.get()}) {
    const ServiceStats st = settled(*x);
    EXPECT_EQ(st.state_slots_used, 0);
    EXPECT_EQ(st.kv_blocks_used, st.prefix.cached_blocks);
    EXPECT_EQ(st.waiting, 0);
  }
  (void)ca;
}

// Hybrid models only (a pure-MLA model has no recurrent state to snapshot).
class PrefixSchedulerHybrid : public PrefixScheduler {};

TEST_P(PrefixSchedulerHybrid, InjectedSnapshotFaultsChangeTheOutput) {
  ASSERT_TRUE(hybrid());
  const auto first = tokens(100, 7);
  const auto second = cat(first, tokens(40, 8));  // hits the snapshot at 96
  Collected off;
  {
    auto s = make(config(false));
    off = run(*s, second, 8);
  }
  {
    auto s = make(config(true));
    run(*s, first, 2);
    const Collected warm = run(*s, second, 8);
    EXPECT_EQ(warm.cached_tokens, 96);
    expect_same(warm, off, "no fault");
  }
  for (SnapshotFault f : {SnapshotFault::kZero, SnapshotFault::kStale, SnapshotFault::kOneTokenLate}) {
    auto s = make(config(true, f));
    run(*s, first, 2);
    const Collected warm = run(*s, second, 8);
    EXPECT_EQ(warm.cached_tokens, 96) << "fault " << static_cast<int>(f);
    EXPECT_TRUE(differs(warm, off)) << "fault " << static_cast<int>(f) << " went unnoticed";
  }
}

std::string name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixScheduler,
                         ::testing::Values("k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny", "deepseek-v3-tiny",
                                           "deepseek-v32-sparse-tiny", "qwen3moe-micro-bf16"),
                         name);
INSTANTIATE_TEST_SUITE_P(Models, PrefixSchedulerHybrid, ::testing::Values("k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny"),
                         name);

}  // namespace
}  // namespace kestrel
