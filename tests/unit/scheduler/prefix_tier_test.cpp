// The prefix cache's disk tier (L3) through the scheduler on real tiny models (K3 hybrid, K3 with DSA layers,
// DeepSeek V3 pure MLA, DeepSeek V3.2 sparse): a conversation writes its prefixes down; a FRESH scheduler (new
// pools, as after a restart) over the same directory restores them at admission, and its answers (tokens,
// log-probabilities, top-5) equal a cache-off run bit for bit. A corrupted object, an object written for another
// model and another fingerprint give no hit from it (counted), and the answers stay bit-identical.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "cache/block_hash.h"
#include "cache/disk_store.h"
#include "cache/tier_object.h"
#include "cache/tier_segments.h"
#include "prefix_tier_util.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using namespace tiers;  // NOLINT: the shared fixture and helpers

class PrefixTier : public TierFixture {
 protected:
  // The first life of the server: a conversation with the disk tier, flushed, then the scheduler is gone.
  void populate(const std::string& disk, const Conversation& off) {
    auto s = make(config(true, disk));
    ASSERT_TRUE(s);
    const Conversation c = conversation(*s);
    for (int t = 0; t < kTurns; ++t) expect_same(c.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "first life, turn " + std::to_string(t));
    s->flush_prefix_tier();
    const ServiceStats st = settled(*s);
    EXPECT_TRUE(st.prefix.disk.on);
    EXPECT_EQ(st.prefix.disk.hits, 0) << "an empty directory has nothing to hit";
    EXPECT_GT(st.prefix.disk.written, 0);
    EXPECT_EQ(st.prefix.disk.written, st.prefix.disk.submitted);
    EXPECT_EQ(st.prefix.disk.dropped, 0);
    EXPECT_EQ(st.prefix.disk.write_errors, 0);
    EXPECT_EQ(st.prefix.disk.objects, st.prefix.disk.written);
  }
  // Where the disk store keeps the object of `kind` at the boundary `tokens_at` of `prompt` (pages: its last segment).
  std::string object_path(const std::string& disk, const std::vector<int32_t>& prompt, int tokens_at,
                          TierPayloadKind kind) {
    const Digest name = kind == TierPayloadKind::kPages ? last_segment_name(prompt, tokens_at)
                                                         : tier_store_key(boundary_key(prompt, tokens_at), kind);
    const std::string hex = to_hex(name);
    return disk + "/" + hex.substr(0, 2) + "/" + hex.substr(2, 2) + "/" + hex;
  }
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
  EXPECT_EQ(st.prefix.disk.hits, kTurns) << "every turn is deeper than what the live pools hold";
  int64_t restored = 0;
  for (const auto& p : on.prompts) restored += deepest(p);
  EXPECT_EQ(st.prefix.disk.hit_tokens, restored);
  EXPECT_EQ(st.prefix.hit_tokens, restored);
  EXPECT_EQ(st.prefix.disk.corrupt, 0);
  EXPECT_EQ(st.prefix.disk.incomplete, 0);
  EXPECT_EQ(st.prefix.disk.read_errors, 0);
  EXPECT_EQ(st.prefix.disk.no_room, 0);
  EXPECT_EQ(st.prefix.snapshots > 0, hybrid()) << "restored snapshots join the live cache";
}

TEST_P(PrefixTier, DamagedObjectsAreNoHit) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off);
  const Conversation& last = off;  // the prompts are the same in every life (the answers are)
  const int at = deepest(last.prompts.back());
  // 1. Flip one byte in the last pages object of the last turn's deepest boundary.
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
    const Digest key = boundary_key(last.prompts[kTurns - 2], at2);
    const Digest name = last_segment_name(last.prompts[kTurns - 2], at2);
    auto bytes = (*store)->get(name);
    ASSERT_TRUE(bytes && bytes->has_value());
    auto obj = parse_tier_object(**bytes, key, model_digest(full_fingerprint(kFingerprint)),
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
  EXPECT_EQ(st.prefix.disk.corrupt, 2) << "the flipped byte and the foreign model digest";
  // A pure-MLA boundary needs no snapshot: the turn before the last still restores the full segments it shares
  // with the last turn's boundary (12 of its 14 blocks), deeper than the live pools' 10.
  EXPECT_EQ(st.prefix.disk.hits, hybrid() ? kTurns - 2 : kTurns - 1);
  if (!hybrid()) {
    EXPECT_EQ(on.out[kTurns - 2].cached_tokens, 12 * kPage);
  }
  // The corrupt object was erased, and the turn's own prefill wrote that boundary down again, whole.
  s.reset();  // releases the directory
  auto store = DiskStore::open(DiskStoreOptions{disk.path(), 256ll << 20, {}});
  ASSERT_TRUE(store) << store.error().message();
  auto bytes = (*store)->get(last_segment_name(last.prompts.back(), at));
  ASSERT_TRUE(bytes && bytes->has_value());
  EXPECT_TRUE(parse_tier_object(**bytes, boundary_key(last.prompts.back(), at), model_digest(full_fingerprint(kFingerprint)),
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
  EXPECT_EQ(st.prefix.disk.hits, 0);
  EXPECT_EQ(st.prefix.disk.hit_tokens, 0);
  EXPECT_GT(st.prefix.disk.queries, 0) << "it looked, under its own keys";
  EXPECT_EQ(st.prefix.disk.corrupt, 0);
}

// The cache dtype is part of the fingerprint: objects written by an fp32 server are never a hit for a bf16 one
// (whose answers equal its own cache-off run), and a bf16 server's objects restore for the next bf16 server.
TEST_P(PrefixTier, OtherKvCacheDtypeNeverHits) {
  const Conversation off32 = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off32);
  auto bf16 = [](SchedulerConfig c) {
    c.cache.kv_dtype = KvCacheDtype::kBF16;
    return c;
  };
  Conversation off;
  {
    auto s = make(bf16(config(false)));
    off = conversation(*s);
  }
  for (int life = 0; life < 2; ++life) {
    auto s = make(bf16(config(true, disk.path())));
    ASSERT_TRUE(s);
    const Conversation on = conversation(*s);
    for (int t = 0; t < kTurns; ++t)
      expect_same(on.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "bf16 life " + std::to_string(life) + ", turn " + std::to_string(t));
    s->flush_prefix_tier();
    const ServiceStats st = settled(*s);
    if (life == 0) {
      EXPECT_EQ(on.out[0].cached_tokens, 0);
      EXPECT_EQ(st.prefix.disk.hits, 0) << "the fp32 objects are not this dtype's";
      EXPECT_GT(st.prefix.disk.queries, 0) << "it looked, under its own keys";
      EXPECT_GT(st.prefix.disk.written, 0);
    } else {
      EXPECT_GT(on.out[0].cached_tokens, 0) << "the first bf16 life's objects restore";
      EXPECT_GT(st.prefix.disk.hits, 0);
    }
    EXPECT_EQ(st.prefix.disk.corrupt, 0);
  }
  EXPECT_NE(off.out[0].logprobs, off32.out[0].logprobs) << "bf16 pages really change the arithmetic";
}

// Boundaries share their pages objects: every boundary of the conversation is stored as its segments, each
// segment once, so the directory holds the union of the boundaries' segments (24 blocks for the 6 turns here)
// instead of every boundary's whole prefix (60 blocks).
TEST_P(PrefixTier, BoundariesShareTheirSegments) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off);
  std::set<std::pair<int64_t, int64_t>> expected;
  int64_t whole = 0;
  for (const auto& p : off.prompts) {
    const int64_t blocks = deepest(p) / kPage;
    whole += blocks;
    for (const PageSegment& g : page_segments(blocks, kSegmentBlocks)) expected.insert({g.first, g.end});
  }
  int64_t want_blocks = 0;
  for (const auto& [first, end] : expected) want_blocks += end - first;
  // The pages objects in the directory: their kind byte and block count from the header (tier_object.h).
  int64_t objects = 0, blocks = 0, snapshots = 0;
  for (const auto& e : fs::recursive_directory_iterator(disk.path())) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    uint8_t h[12] = {};
    if (!f.read(reinterpret_cast<char*>(h), sizeof(h)) || std::memcmp(h, "KTOB", 4) != 0) continue;  // not an object
    if (h[6] == static_cast<uint8_t>(TierPayloadKind::kSnapshot)) {
      ++snapshots;
      continue;
    }
    ASSERT_EQ(h[6], static_cast<uint8_t>(TierPayloadKind::kPages));
    const int64_t n = h[8] | h[9] << 8 | h[10] << 16 | static_cast<int64_t>(h[11]) << 24;
    EXPECT_LE(n, kSegmentBlocks) << "no object holds more than one segment";
    ++objects;
    blocks += n;
  }
  EXPECT_EQ(objects, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(blocks, want_blocks);
  EXPECT_LT(want_blocks * 2, whole) << "sharing stores well under half of the whole prefixes here";
  EXPECT_EQ(snapshots, hybrid() ? kTurns : 0);
}

// A boundary is restored only when every one of its segments is: a shared segment missing from the directory
// means no hit from any boundary beyond it (counted incomplete), never a partial one, and the answers stay
// bit-identical. The turn that misses recomputes and writes the segment again, so the turns after it hit.
TEST_P(PrefixTier, MissingSharedSegmentIsNoHitBeyondIt) {
  const Conversation off = cache_off();
  testing::TempDir disk;
  populate(disk.path(), off);
  // The segment [3, 6) belongs to every boundary from turn 1 on (6 blocks and deeper), not to turn 0's (4 blocks).
  const std::vector<int32_t>& p1 = off.prompts[1];
  ASSERT_EQ(deepest(p1) / kPage, 6);
  {
    auto store = DiskStore::open(DiskStoreOptions{disk.path(), 256ll << 20, {}});
    ASSERT_TRUE(store) << store.error().message();
    const Digest name = tier_segment_key(boundary_key(p1, 6 * kPage), 3);
    auto got = (*store)->get(name);
    ASSERT_TRUE(got && got->has_value()) << "the shared segment was written";
    ASSERT_TRUE((*store)->erase(name).is_ok());
  }
  auto s = make(config(true, disk.path()));
  ASSERT_TRUE(s);
  // Each turn waits for the writes of the turn before (turn 1 writes the missing segment again).
  const Conversation on = conversation(*s, [&](int) { s->flush_prefix_tier(); });
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "missing segment, turn " + std::to_string(t));
    if (t != 1) {
      EXPECT_EQ(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t;
    }
  }
  EXPECT_EQ(on.out[1].cached_tokens, deepest(on.prompts[0])) << "turn 1 keeps only what the live pools hold";
  s->flush_prefix_tier();
  const ServiceStats st = settled(*s);
  EXPECT_EQ(st.prefix.disk.hits, kTurns - 1);
  // A hybrid boundary's snapshot shows it was written, so the gap is counted; a pure-MLA boundary whose own last
  // segment is the missing one looks never written.
  EXPECT_EQ(st.prefix.disk.incomplete >= 1, hybrid()) << "turn 1's boundary lacked a segment";
  EXPECT_EQ(st.prefix.disk.corrupt, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixTier,
                         ::testing::Values("k3-tiny", "k3-tiny-dsa", "deepseek-v3-tiny", "deepseek-v32-sparse-tiny"),
                         param_name);

}  // namespace
}  // namespace kestrel
