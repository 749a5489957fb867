// The prefix cache's host-memory tier (L2) through the scheduler on real tiny models (K3 hybrid, K3 with DSA layers,
// DeepSeek V3 pure MLA). The live pools are so small that an unrelated long request between the turns of a
// conversation evicts everything they cached; with host memory on, each turn restores the previous turn's boundary
// from it, and the answers (tokens, log-probabilities, top-5) equal a cache-off run bit for bit. A flipped byte in a
// host object is no hit from it (counted, erased, a shallower boundary serves) and the same bits; a branch point
// seen twice reaches host memory; a budget smaller than one object stores nothing; with the disk tier too, a boundary both hold is served from host memory and the
// disk is not asked, and a disk hit is written up into host memory.
#include <gtest/gtest.h>

#include "cache/block_hash.h"
#include "cache/cache_pools.h"
#include "cache/host_store.h"
#include "cache/tier_object.h"
#include "prefix_tier_util.h"

namespace kestrel {
namespace {

using namespace tiers;  // NOLINT: the shared fixture and helpers

constexpr int kPoolBlocks = 20;     // 320 tokens: the longest turn (305 + 6) fits, the filler evicts the rest
constexpr int kFillerTokens = 300;  // 19 blocks with its answer

std::shared_ptr<HostStore> new_host_store() {
  auto r = HostStore::create(HostStoreOptions{256ll << 20});
  EXPECT_TRUE(r);
  return std::shared_ptr<HostStore>(std::move(r).value());
}

class PrefixHost : public TierFixture {
 protected:
  // Live pools of kPoolBlocks blocks and 2 slots (block and slot sizes as the pools compute them), host memory on.
  SchedulerConfig small_pools(int64_t host_bytes, std::shared_ptr<HostStore> store = nullptr) {
    SchedulerConfig c = config(true);
    CachePoolConfig probe_cfg = c.cache;
    probe_cfg.max_slots = 1;
    auto probe = CachePools::create(engine_->model().cache_geometry(), probe_cfg);
    EXPECT_TRUE(probe) << probe.error().message();
    c.cache.max_slots = 2;
    c.cache.budget_bytes = (*probe)->slot_bytes() * c.cache.max_slots + (*probe)->block_bytes() * kPoolBlocks;
    c.max_context = kPoolBlocks * kPage;
    c.prefix.host_budget_bytes = host_bytes;
    c.prefix.host_store = std::move(store);
    return c;
  }
  // Before every turn but the first: an unrelated prompt that needs nearly every block of the pools (another one
  // each time, so that fillers never hit each other).
  std::function<void(int)> filler(Scheduler& s) {
    return [&s](int t) {
      if (t > 0) {
        EXPECT_TRUE(run(s, tokens(kFillerTokens, 77 + t), 4).error.empty());
      }
    };
  }
  // The chain key of `prompt`'s boundary at `tokens_at` (the scheduler's keys: same root, same fingerprint).
  // What turn t > 0 restores after the filler: the boundary turn t-1 stored at its prompt end (floored to the grid).
  static int previous_end(const Conversation& c, int t) {
    return static_cast<int>(c.prompts[static_cast<size_t>(t - 1)].size() / kChunk * kChunk);
  }
  void expect_no_leaks(Scheduler& s) {
    s.flush_prefix_cache();
    for (int i = 0; i < 200 && s.stats().kv_blocks_used != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const ServiceStats st = settled(s);
    EXPECT_EQ(st.kv_blocks_used, 0) << "leaked blocks";
    EXPECT_EQ(st.prefix.cached_blocks, 0);
    EXPECT_EQ(st.prefix.snapshots, 0) << "leaked snapshots";
    EXPECT_EQ(st.state_slots_used, 0);
  }
};

TEST_P(PrefixHost, EvictedTurnsRestoreFromHostMemoryBitwise) {
  const Conversation off = cache_off();
  // The live pools alone: the filler leaves nothing of the conversation to hit.
  {
    auto s = make(small_pools(0));
    ASSERT_TRUE(s);
    const Conversation l1 = conversation(*s, filler(*s));
    for (int t = 0; t < kTurns; ++t) {
      const auto i = static_cast<size_t>(t);
      expect_same(l1.out[i], off.out[i], "live pools only, turn " + std::to_string(t));
      EXPECT_EQ(l1.out[i].cached_tokens, 0) << "turn " << t << ": the filler evicted it";
    }
    const ServiceStats st = settled(*s);
    EXPECT_FALSE(st.prefix.host.on);
    EXPECT_GT(st.prefix.evicted_blocks, 0);
  }
  // With host memory: every turn after the first restores the previous turn's boundary from it.
  auto s = make(small_pools(256ll << 20));
  ASSERT_TRUE(s);
  const Conversation on = conversation(*s, filler(*s));
  int64_t restored = 0;
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "host memory, turn " + std::to_string(t));
    const int want = t == 0 ? 0 : previous_end(on, t);
    EXPECT_EQ(on.out[i].cached_tokens, want) << "turn " << t;
    restored += want;
  }
  const ServiceStats st = settled(*s);
  EXPECT_TRUE(st.prefix.host.on);
  EXPECT_FALSE(st.prefix.disk.on);
  EXPECT_GT(st.prefix.evicted_blocks, 0) << "the pools were under pressure";
  EXPECT_EQ(st.prefix.host.hits, kTurns - 1);
  EXPECT_EQ(st.prefix.host.hit_tokens, restored);
  EXPECT_EQ(st.prefix.hit_tokens, restored);
  EXPECT_EQ(st.prefix.host.corrupt, 0);
  EXPECT_EQ(st.prefix.host.incomplete, 0);
  EXPECT_EQ(st.prefix.host.read_errors, 0);
  EXPECT_EQ(st.prefix.host.no_room, 0);
  EXPECT_GT(st.prefix.host.written, 0);
  EXPECT_EQ(st.prefix.host.written, st.prefix.host.submitted) << "host memory never drops a write";
  EXPECT_EQ(st.prefix.host.dropped, 0);
  EXPECT_EQ(st.prefix.host.write_errors, 0);
  EXPECT_GT(st.prefix.host.objects, 0);
  EXPECT_GT(st.prefix.host.bytes, 0);
  EXPECT_GT(st.prefix.host.read_bytes, 0);
  EXPECT_EQ(st.prefix.host.evictions, 0);
  expect_no_leaks(*s);
}

TEST_P(PrefixHost, FlippedByteIsNoHit) {
  const Conversation off = cache_off();
  const auto store = new_host_store();
  auto s = make(small_pools(0, store));
  ASSERT_TRUE(s);
  // Before turn 3 (after its filler): one byte of the pages object turn 2 stored is flipped.
  const int damaged = previous_end(off, 3);
  const Digest name = last_segment_name(off.prompts[2], damaged);
  auto before = [&](int t) {
    filler(*s)(t);
    if (t != 3) return;
    auto got = store->get(name);
    ASSERT_TRUE(got && got->has_value()) << "turn 2 stored its prompt end in host memory";
    std::vector<uint8_t> bytes = **got;
    bytes[bytes.size() / 2] ^= 0x01;
    ASSERT_TRUE(store->erase(name).is_ok());
    ASSERT_TRUE(store->put_owned(name, std::move(bytes)).is_ok());
  };
  const Conversation on = conversation(*s, before);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "damaged host object, turn " + std::to_string(t));
    // Turn 3 falls back to the boundary turn 1 stored.
    const int want = t == 0 ? 0 : t == 3 ? previous_end(on, 2) : previous_end(on, t);
    EXPECT_EQ(on.out[i].cached_tokens, want) << "turn " << t;
  }
  EXPECT_LT(previous_end(on, 2), damaged);
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.host.corrupt, 1);
  EXPECT_EQ(st.prefix.host.hits, kTurns - 1);
  EXPECT_FALSE(*store->contains(name)) << "the corrupt object was erased";
  expect_no_leaks(*s);
}

// Two prompts that share 64 tokens and then part: the second sighting of the shared part makes it a boundary in host
// memory (a hybrid model snapshots the branch point; a pure-MLA model writes its live hit there), so a third prompt
// over the same 64 tokens restores them from host memory after the pools lost them.
TEST_P(PrefixHost, BranchPointReachesHostMemory) {
  const auto shared = tokens(64, 5);
  const std::vector<std::vector<int32_t>> prompts = {cat(shared, tokens(40, 6)), cat(shared, tokens(40, 7)),
                                                     cat(shared, tokens(40, 8))};
  auto go = [&](Scheduler& s) {
    std::vector<Collected> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (i == 2) filler(s)(1);
      out.push_back(run(s, prompts[i], 4));
    }
    return out;
  };
  std::vector<Collected> off;
  {
    auto s = make(config(false));
    off = go(*s);
  }
  auto s = make(small_pools(256ll << 20));
  ASSERT_TRUE(s);
  const auto on = go(*s);
  for (size_t i = 0; i < prompts.size(); ++i) expect_same(on[i], off[i], "prompt " + std::to_string(i));
  EXPECT_EQ(on[0].cached_tokens, 0);
  EXPECT_EQ(on[1].cached_tokens, hybrid() ? 0 : 64) << "a live hit needs a snapshot at 64 on a hybrid model";
  EXPECT_EQ(on[2].cached_tokens, 64) << "restored from host memory";
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.host.hits, 1);
  EXPECT_EQ(st.prefix.host.hit_tokens, 64);
  expect_no_leaks(*s);
}

TEST_P(PrefixHost, BudgetSmallerThanOneObjectStoresNothing) {
  const Conversation off = cache_off();
  auto s = make(small_pools(64));  // less than an object's frame alone
  ASSERT_TRUE(s);
  const Conversation on = conversation(*s);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "tiny host budget, turn " + std::to_string(t));
  }
  const ServiceStats st = settled(*s);
  EXPECT_TRUE(st.prefix.host.on);
  EXPECT_EQ(st.prefix.host.objects, 0);
  EXPECT_EQ(st.prefix.host.bytes, 0);
  EXPECT_EQ(st.prefix.host.hits, 0);
  EXPECT_EQ(st.prefix.host.written, 0);
  EXPECT_GT(st.prefix.host.write_errors, 0) << "each refused object is counted";
  EXPECT_EQ(st.prefix.host.write_errors, st.prefix.host.submitted);
  expect_no_leaks(*s);
}

// Host memory is asked before the disk: a fresh scheduler over a host store and a directory that both hold every
// boundary restores each turn from host memory and never asks the disk. Over an empty host store, the disk serves,
// and each disk hit is written up into host memory, which then serves a third scheduler alone.
TEST_P(PrefixHost, HostMemoryBeforeDiskAndDiskHitsMoveUp) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  auto host_config = [&](std::shared_ptr<HostStore> store, bool with_disk) {
    SchedulerConfig c = config(true, with_disk ? disk.path() : "");
    c.prefix.host_store = std::move(store);
    return c;
  };
  auto all_restored = [&](Scheduler& s, const std::string& what) {
    const Conversation c = conversation(s);
    int64_t restored = 0;
    for (int t = 0; t < kTurns; ++t) {
      const auto i = static_cast<size_t>(t);
      expect_same(c.out[i], off.out[i], what + ", turn " + std::to_string(t));
      EXPECT_EQ(c.out[i].cached_tokens, deepest(c.prompts[i])) << what << ", turn " << t;
      restored += deepest(c.prompts[i]);
    }
    return restored;
  };
  const auto both = new_host_store();
  {
    auto s = make(host_config(both, true));
    ASSERT_TRUE(s);
    const Conversation c = conversation(*s);
    for (int t = 0; t < kTurns; ++t) {
      expect_same(c.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "first, turn " + std::to_string(t));
    }
    s->flush_prefix_tier();
    const ServiceStats st = settled(*s);
    EXPECT_GT(st.prefix.disk.objects, 0);
    EXPECT_EQ(st.prefix.host.objects, st.prefix.disk.objects) << "the same objects in both";
  }
  {
    auto s = make(host_config(both, true));
    ASSERT_TRUE(s);
    const int64_t restored = all_restored(*s, "host and disk");
    const ServiceStats st = settled(*s);
    EXPECT_EQ(st.prefix.host.hits, kTurns);
    EXPECT_EQ(st.prefix.host.hit_tokens, restored);
    EXPECT_EQ(st.prefix.disk.queries, 0) << "the disk is not asked for what host memory serves";
    EXPECT_EQ(st.prefix.disk.hits, 0);
    EXPECT_GT(st.prefix.disk.objects, 0);
  }
  const auto up = new_host_store();
  {
    auto s = make(host_config(up, true));
    ASSERT_TRUE(s);
    all_restored(*s, "disk, empty host memory");
    s->flush_prefix_tier();
    const ServiceStats st = settled(*s);
    EXPECT_EQ(st.prefix.disk.hits, kTurns);
    EXPECT_EQ(st.prefix.host.hits, 0);
    EXPECT_EQ(st.prefix.host.queries, kTurns) << "host memory was asked first, and had nothing";
  }
  auto s = make(host_config(up, false));
  ASSERT_TRUE(s);
  const int64_t restored = all_restored(*s, "host memory filled from disk hits");
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.host.hits, kTurns);
  EXPECT_EQ(st.prefix.host.hit_tokens, restored);
  EXPECT_EQ(st.prefix.host.corrupt, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixHost, ::testing::Values("k3-tiny", "k3-tiny-dsa", "deepseek-v3-tiny"),
                         param_name);

}  // namespace
}  // namespace kestrel
