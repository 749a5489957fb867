// Shared by the prefix cache's lower-tier tests through the scheduler (disk L3: prefix_tier_test.cpp, Redis L4:
// prefix_redis_test.cpp): a tiny model per test parameter, a multi-turn conversation whose turns grow past the chunk
// grid, and the bitwise comparison of two runs (tokens, log-probabilities, top-5).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/block_hash.h"
#include "cache/cache_pools.h"
#include "cache/tier_object.h"
#include "common/scheduler_client.h"
#include "common/test_util.h"
#include "scheduler/scheduler.h"

namespace kestrel::tiers {

using testing::Client;
using testing::Collected;

inline std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101 + 5) % 500);
  return p;
}

inline std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

constexpr int64_t kPage = 16, kChunk = 32;
constexpr int kTurns = 6;
constexpr int64_t kSegmentBlocks = 3;  // blocks per pages object in the tiers (see TierFixture::make)
const char* const kFingerprint = "test-model";

inline SchedulerConfig config(bool prefix, const std::string& disk = "", const std::string& fingerprint = kFingerprint) {
  SchedulerConfig c;
  c.cache.budget_bytes = 64ll << 20;
  c.cache.page_tokens = kPage;
  c.cache.max_slots = 8;
  c.prefill_chunk = kChunk;
  c.max_batch_tokens = 64;
  c.max_context = 1024;
  c.prefix_cache = prefix;
  c.prefix.snapshot_budget_bytes = 16ll << 20;
  c.prefix.disk_dir = disk;
  c.prefix.disk_budget_bytes = 256ll << 20;
  c.cache_fingerprint = fingerprint;
  return c;
}

// The fingerprint the scheduler seeds key chains with (it appends the cache layout).
inline std::string full_fingerprint(const std::string& fp) { return fp + "|page=" + std::to_string(kPage) + "|kv=fp32"; }

inline void expect_same(const Collected& a, const Collected& b, const std::string& what) {
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

inline Collected run(Scheduler& s, std::vector<int32_t> p, int n) {
  Client c;
  EXPECT_TRUE(s.submit(c.make(std::move(p), n)));
  return c.wait();
}

inline ServiceStats settled(Scheduler& s) {
  for (int i = 0; i < 200; ++i) {
    ServiceStats st = s.stats();
    if (st.running == 0 && st.waiting == 0) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s.stats();
}

struct Conversation {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Collected> out;
};

// The name of the last pages object (segment) of the boundary `tokens_at` of `prompt`, and its key.
inline Digest boundary_key(const std::vector<int32_t>& prompt, int tokens_at, const std::string& fp = kFingerprint) {
  std::vector<Digest> keys;
  extend_block_keys(chain_root(full_fingerprint(fp), ""),
                    std::span<const int32_t>(prompt.data(), static_cast<size_t>(tokens_at)), kPage, keys);
  return keys.back();
}
inline Digest last_segment_name(const std::vector<int32_t>& prompt, int tokens_at) {
  const int64_t blocks = tokens_at / kPage;
  return tier_segment_key(boundary_key(prompt, tokens_at), (blocks - 1) / kSegmentBlocks * kSegmentBlocks);
}

// The deepest hit a prompt can have: its length less one token, floored to the chunk grid.
inline int deepest(const std::vector<int32_t>& prompt) { return static_cast<int>((prompt.size() - 1) / kChunk * kChunk); }

class TierFixture : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing::TempDir>();
    testing::make_checkpoint(GetParam(), dir_->path());
    auto e = Engine::load(dir_->path());
    ASSERT_TRUE(e) << e.error().message();
    engine_ = std::move(*e);
  }
  // Every scheduler stores a boundary's pages in the tiers as segments of kSegmentBlocks blocks (unless the test
  // sets its own size): boundaries share their full segments and most end in a short one of their own.
  std::unique_ptr<Scheduler> make(SchedulerConfig c) {
    if (c.prefix.tier_object_bytes == PrefixCacheConfig{}.tier_object_bytes)
      c.prefix.tier_object_bytes = kSegmentBlocks * block_bytes();
    auto s = Scheduler::create(*engine_, c);
    EXPECT_TRUE(s) << s.error().message();
    return s ? std::move(*s) : nullptr;
  }
  // Each turn's prompt = the previous prompt + its answer + a new user part (lengths 70, 99, 137, 184, 240, 305:
  // none on the grid).
  // `before_turn(t)`, when given, runs before turn t is submitted (a test's fault injection).
  Conversation conversation(Scheduler& s, const std::function<void(int)>& before_turn = {}) {
    Conversation c;
    std::vector<int32_t> history = tokens(70, 1);
    for (int t = 0; t < kTurns; ++t) {
      if (before_turn) before_turn(t);
      c.prompts.push_back(history);
      c.out.push_back(run(s, history, 6));
      history = cat(cat(history, c.out.back().tokens), tokens(23 + 9 * t, 10 + t));
    }
    return c;
  }
  Conversation cache_off() {
    auto s = make(config(false));
    return conversation(*s);
  }
  // The bytes of one block of the pools, as they compute it.
  int64_t block_bytes() const {
    CachePoolConfig probe = config(true).cache;
    probe.max_slots = 1;
    auto p = CachePools::create(engine_->model().cache_geometry(), probe);
    EXPECT_TRUE(p) << p.error().message();
    return p ? (*p)->block_bytes() : 1;
  }
  bool hybrid() const { return !engine_->model().cache_geometry().kda_layers.empty(); }

  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<Engine> engine_;
};

inline std::string param_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

}  // namespace kestrel::tiers
