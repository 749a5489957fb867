// The prefix cache's disk tier (L3) through the scheduler on real tiny models (K3 hybrid, K3 with DSA layers,
// DeepSeek V3 pure MLA, DeepSeek V3.2 sparse): a conversation writes its prefixes down; a FRESH scheduler (new
// pools, as after a restart) over the same directory restores them at admission, and its answers (tokens,
// log-probabilities, top-5) equal a cache-off run bit for bit. A corrupted object, an object written for another
// model and another fingerprint give no hit from it (counted), and the answers stay bit-identical.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cache/block_hash.h"
#include "cache/disk_store.h"
#include "cache/tier_object.h"
#include "common/scheduler_client.h"
#include "common/test_util.h"
#include "scheduler/scheduler.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
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
constexpr int kTurns = 6;
const char* const kFingerprint = "test-model";

SchedulerConfig config(bool prefix, const std::string& disk = "", const std::string& fingerprint = kFingerprint) {
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
std::string full_fingerprint(const std::string& fp) { return fp + "|page=" + std::to_string(kPage) + "|kv=fp32"; }

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

Collected run(Scheduler& s, std::vector<int32_t> p, int n) {
  Client c;
  EXPECT_TRUE(s.submit(c.make(std::move(p), n)));
  return c.wait();
}

ServiceStats settled(Scheduler& s) {
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

// The deepest hit a prompt can have: its length less one token, floored to the chunk grid.
int deepest(const std::vector<int32_t>& prompt) { return static_cast<int>((prompt.size() - 1) / kChunk * kChunk); }

class PrefixTier : public ::testing::TestWithParam<const char*> {
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
    return s ? std::move(*s) : nullptr;
  }
  // Each turn's prompt = the previous prompt + its answer + a new user part (lengths 70, 99, 137, 184, 240, 305:
  // none on the grid).
  Conversation conversation(Scheduler& s) {
    Conversation c;
    std::vector<int32_t> history = tokens(70, 1);
    for (int t = 0; t < kTurns; ++t) {
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
  // The first life of the server: a conversation with the disk tier, flushed, then the scheduler is gone.
  void populate(const std::string& disk, const Conversation& off) {
    auto s = make(config(true, disk));
    ASSERT_TRUE(s);
    const Conversation c = conversation(*s);
    for (int t = 0; t < kTurns; ++t) expect_same(c.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "first life, turn " + std::to_string(t));
    s->flush_prefix_tier();
    const ServiceStats st = settled(*s);
    EXPECT_TRUE(st.prefix.disk);
    EXPECT_EQ(st.prefix.disk_hits, 0) << "an empty directory has nothing to hit";
    EXPECT_GT(st.prefix.disk_written, 0);
    EXPECT_EQ(st.prefix.disk_written, st.prefix.disk_submitted);
    EXPECT_EQ(st.prefix.disk_dropped, 0);
    EXPECT_EQ(st.prefix.disk_write_errors, 0);
    EXPECT_EQ(st.prefix.disk_objects, st.prefix.disk_written);
  }
  // Where the disk store keeps the object of `kind` at the boundary `tokens_at` of `prompt`.
  std::string object_path(const std::string& disk, const std::vector<int32_t>& prompt, int tokens_at,
                          TierPayloadKind kind) {
    std::vector<Digest> keys;
    extend_block_keys(chain_root(full_fingerprint(kFingerprint), ""),
                      std::span<const int32_t>(prompt.data(), static_cast<size_t>(tokens_at)), kPage, keys);
    const Digest name = tier_store_key(keys.back(), kind);
    const std::string hex = to_hex(name);
    return disk + "/" + hex.substr(0, 2) + "/" + hex.substr(2, 2) + "/" + hex;
  }
  bool hybrid() const { return !engine_->model().cache_geometry().kda_layers.empty(); }

  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(PrefixTier, RestartHitsFromDiskBitwise) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off);
  auto s = make(config(true, disk.path()));  // a restart: fresh pools, empty radix, the same directory
  ASSERT_TRUE(s);
  const Conversation on = conversation(*s);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "after restart, turn " + std::to_string(t));
    EXPECT_EQ(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t << " restores its deepest boundary";
  }
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.disk_hits, kTurns) << "every turn is deeper than what the live pools hold";
  int64_t restored = 0;
  for (const auto& p : on.prompts) restored += deepest(p);
  EXPECT_EQ(st.prefix.disk_hit_tokens, restored);
  EXPECT_EQ(st.prefix.hit_tokens, restored);
  EXPECT_EQ(st.prefix.disk_corrupt, 0);
  EXPECT_EQ(st.prefix.disk_incomplete, 0);
  EXPECT_EQ(st.prefix.disk_read_errors, 0);
  EXPECT_EQ(st.prefix.disk_no_room, 0);
  EXPECT_EQ(st.prefix.snapshots > 0, hybrid()) << "restored snapshots join the live cache";
}

TEST_P(PrefixTier, DamagedObjectsAreNoHit) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off);
  const Conversation& last = off;  // the prompts are the same in every life (the answers are)
  const int at = deepest(last.prompts.back());
  // 1. Flip one byte in the pages object of the last turn's deepest boundary.
  const std::string pages = object_path(disk.path(), last.prompts.back(), at, TierPayloadKind::kPages);
  ASSERT_TRUE(fs::exists(pages)) << pages;
  {
    std::fstream f(pages, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(pages));
    f.seekg(size / 2);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x01);
    f.seekp(size / 2);
    f.write(&b, 1);
  }
  // 2. Re-file the pages object of the turn before under a foreign model digest (a valid object, well framed,
  // under the right name: only the digest check can refuse it).
  const int at2 = deepest(last.prompts[kTurns - 2]);
  {
    auto store = DiskStore::open(DiskStoreOptions{disk.path(), 256ll << 20, {}});
    ASSERT_TRUE(store) << store.error().message();
    std::vector<Digest> keys;
    extend_block_keys(chain_root(full_fingerprint(kFingerprint), ""),
                      std::span<const int32_t>(last.prompts[kTurns - 2].data(), static_cast<size_t>(at2)), kPage, keys);
    const Digest name = tier_store_key(keys.back(), TierPayloadKind::kPages);
    auto bytes = (*store)->get(name);
    ASSERT_TRUE(bytes && bytes->has_value());
    auto obj = parse_tier_object(**bytes, keys.back(), model_digest(full_fingerprint(kFingerprint)),
                                 TierPayloadKind::kPages);
    ASSERT_TRUE(obj) << obj.error().message();
    obj->model = model_digest(full_fingerprint("another-model"));
    ASSERT_TRUE((*store)->erase(name).is_ok());
    ASSERT_TRUE((*store)->put(name, serialize_tier_object(*obj)).is_ok());
  }
  auto s = make(config(true, disk.path()));
  ASSERT_TRUE(s);
  const Conversation on = conversation(*s);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "damaged tier, turn " + std::to_string(t));
    if (t < kTurns - 2) {
      EXPECT_EQ(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t;
    }
  }
  // The damaged boundaries are not hit: those turns fall back to what the live pools hold (the turn before).
  EXPECT_LT(on.out[kTurns - 2].cached_tokens, at2);
  EXPECT_LT(on.out[kTurns - 1].cached_tokens, at);
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.disk_corrupt, 2) << "the flipped byte and the foreign model digest";
  EXPECT_EQ(st.prefix.disk_hits, kTurns - 2);
  // The corrupt object was erased, and the turn's own prefill wrote that boundary down again, whole.
  s.reset();  // releases the directory
  auto store = DiskStore::open(DiskStoreOptions{disk.path(), 256ll << 20, {}});
  ASSERT_TRUE(store) << store.error().message();
  std::vector<Digest> keys;
  extend_block_keys(chain_root(full_fingerprint(kFingerprint), ""),
                    std::span<const int32_t>(last.prompts.back().data(), static_cast<size_t>(at)), kPage, keys);
  auto bytes = (*store)->get(tier_store_key(keys.back(), TierPayloadKind::kPages));
  ASSERT_TRUE(bytes && bytes->has_value());
  EXPECT_TRUE(parse_tier_object(**bytes, keys.back(), model_digest(full_fingerprint(kFingerprint)),
                                TierPayloadKind::kPages));
}

TEST_P(PrefixTier, OtherFingerprintNeverHits) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off);
  auto s = make(config(true, disk.path(), "another-model"));
  ASSERT_TRUE(s);
  const Conversation on = conversation(*s);
  for (int t = 0; t < kTurns; ++t) expect_same(on.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "turn " + std::to_string(t));
  EXPECT_EQ(on.out[0].cached_tokens, 0);
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.disk_hits, 0);
  EXPECT_EQ(st.prefix.disk_hit_tokens, 0);
  EXPECT_GT(st.prefix.disk_queries, 0) << "it looked, under its own keys";
  EXPECT_EQ(st.prefix.disk_corrupt, 0);
}

std::string name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixTier,
                         ::testing::Values("k3-tiny", "k3-tiny-dsa", "deepseek-v3-tiny", "deepseek-v32-sparse-tiny"),
                         name);

}  // namespace
}  // namespace kestrel
