// The prefix cache's Redis tier (L4) through the scheduler on real tiny models (K3 hybrid, DeepSeek V3 pure MLA),
// against a redis-server each test starts on its own TCP port (tests/common/redis_server.h): server A runs a
// conversation and writes its prefixes to Redis; a FRESH server B (new scheduler, new pools, no disk) serves the same
// turns, restores them from Redis, and its answers (tokens, log-probabilities, top-5) equal a cache-off run bit for
// bit. With the disk tier too, a Redis hit is written down to disk. A killed Redis (before or during B's turns), a
// stalled one (SIGSTOP: every call waits out the timeout) and a corrupted or foreign object give no hit from it
// (counted), the requests complete (within the timeout bound when stalled), and the answers stay bit-identical.
#include <gtest/gtest.h>

#include <chrono>

#include "cache/block_hash.h"
#include "cache/redis_store.h"
#include "cache/tier_object.h"
#include "common/redis_server.h"
#include "prefix_tier_util.h"

namespace kestrel {
namespace {

using namespace tiers;  // NOLINT: the shared fixture and helpers
using Clock = std::chrono::steady_clock;

// The stalled-server test's timeout: short, so waiting it out several times stays quick.
constexpr int kTimeoutMs = 200;
// Every other phase talks to a healthy server: its timeout is not what is tested, and a 200 ms one can expire on a
// loaded machine (ctest -j next to other model tests) and turn a hit into a counted read error.
constexpr int kHealthyTimeoutMs = 5000;
// What a busy machine may add to one wait beyond the timeouts it is made of (scheduling, not Redis).
constexpr int kSchedulingSlackMs = 1000;

class PrefixRedis : public TierFixture {
 protected:
  void SetUp() override {
    TierFixture::SetUp();
    if (HasFatalFailure()) return;
    KESTREL_REQUIRE_REDIS_SERVER(bin);
    redis_dir_ = std::make_unique<testing::TempDir>();
    server_ = std::make_unique<testing::RedisServer>(bin, redis_dir_->path(), testing::free_tcp_port());
    ASSERT_TRUE(server_->start()) << "redis-server did not start; log in " << redis_dir_->path() << "/redis.log";
  }
  void TearDown() override {
    if (server_) server_->resume();  // a stopped server is killed all the same, but never leave one stopped
  }
  SchedulerConfig redis_config(const std::string& disk = "", int timeout_ms = kHealthyTimeoutMs) const {
    SchedulerConfig c = config(true, disk);
    c.prefix.redis_host = "127.0.0.1";
    c.prefix.redis_port = server_->port();
    c.prefix.redis_timeout_ms = timeout_ms;
    return c;
  }
  // Server A: a conversation that writes to Redis (nothing to hit there yet), flushed.
  void populate(const Conversation& off) {
    auto s = make(redis_config());
    ASSERT_TRUE(s);
    const Conversation c = conversation(*s);
    for (int t = 0; t < kTurns; ++t) expect_same(c.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "server A, turn " + std::to_string(t));
    s->flush_prefix_tier();
    const ServiceStats st = settled(*s);
    EXPECT_TRUE(st.prefix.redis.on);
    EXPECT_FALSE(st.prefix.disk.on);
    EXPECT_EQ(st.prefix.redis.hits, 0) << "an empty Redis has nothing to hit";
    EXPECT_GT(st.prefix.redis.written, 0);
    EXPECT_EQ(st.prefix.redis.written, st.prefix.redis.submitted);
    EXPECT_EQ(st.prefix.redis.dropped, 0);
    EXPECT_EQ(st.prefix.redis.write_errors, 0);
    EXPECT_EQ(st.prefix.redis.read_errors, 0);
    EXPECT_GT(st.prefix.redis.write_bytes, 0);
    EXPECT_GT(st.prefix.redis.write_ns, 0);
  }
  // A connection of the test's own to the server, to inspect and damage objects.
  std::unique_ptr<RedisStore> direct() const {
    RedisStoreOptions o;
    o.port = server_->port();
    auto s = RedisStore::create(o);
    EXPECT_TRUE(s);
    return std::move(*s);
  }
  // The chain key of `prompt`'s boundary at `tokens_at` (the scheduler's keys: same root, same fingerprint).
  int64_t restorable(const Conversation& c, int from_turn = 0, int to_turn = kTurns) const {
    int64_t n = 0;
    for (int t = from_turn; t < to_turn; ++t) n += deepest(c.prompts[static_cast<size_t>(t)]);
    return n;
  }

  std::unique_ptr<testing::TempDir> redis_dir_;
  std::unique_ptr<testing::RedisServer> server_;
};

TEST_P(PrefixRedis, FreshServerHitsFromRedisBitwise) {
  const Conversation off = cache_off();
  populate(off);
  auto b = make(redis_config());  // another server: fresh pools, empty radix, no disk, the same Redis
  ASSERT_TRUE(b);
  const Conversation on = conversation(*b);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "server B, turn " + std::to_string(t));
    EXPECT_EQ(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t << " restores its deepest boundary";
  }
  const ServiceStats st = settled(*b);
  EXPECT_EQ(st.prefix.redis.hits, kTurns) << "every turn is deeper than what the live pools hold";
  EXPECT_EQ(st.prefix.redis.hit_tokens, restorable(on));
  EXPECT_EQ(st.prefix.hit_tokens, restorable(on));
  EXPECT_EQ(st.prefix.redis.queries, kTurns);
  EXPECT_EQ(st.prefix.redis.corrupt, 0);
  EXPECT_EQ(st.prefix.redis.incomplete, 0);
  EXPECT_EQ(st.prefix.redis.read_errors, 0);
  EXPECT_EQ(st.prefix.redis.no_room, 0);
  EXPECT_GT(st.prefix.redis.read_bytes, 0);
  EXPECT_GT(st.prefix.redis.read_ns, 0);
  EXPECT_EQ(st.prefix.redis.objects, -1) << "a shared store cannot count what it holds";
  EXPECT_EQ(st.prefix.disk.hits, 0);
  EXPECT_EQ(st.prefix.snapshots > 0, hybrid()) << "restored snapshots join the live cache";
}

// Disk and Redis: the disk is asked first (empty here), Redis next; a Redis hit is written down to the disk, so a
// third server with that disk alone restores every turn from it.
TEST_P(PrefixRedis, RedisHitsAreWrittenDownToDisk) {
  const Conversation off = cache_off();
  populate(off);
  testing::TempDir disk;
  {
    auto b = make(redis_config(disk.path()));
    ASSERT_TRUE(b);
    const Conversation on = conversation(*b);
    for (int t = 0; t < kTurns; ++t) expect_same(on.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "disk + redis, turn " + std::to_string(t));
    b->flush_prefix_tier();
    const ServiceStats st = settled(*b);
    EXPECT_EQ(st.prefix.disk.queries, kTurns);
    EXPECT_EQ(st.prefix.disk.hits, 0);
    EXPECT_EQ(st.prefix.redis.hits, kTurns);
    EXPECT_GT(st.prefix.disk.written, 0);
    EXPECT_EQ(st.prefix.disk.write_errors, 0);
  }
  auto c = make(config(true, disk.path()));  // disk only
  ASSERT_TRUE(c);
  const Conversation again = conversation(*c);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(again.out[i], off.out[i], "disk written from redis, turn " + std::to_string(t));
    EXPECT_EQ(again.out[i].cached_tokens, deepest(again.prompts[i])) << "turn " << t;
  }
  const ServiceStats st = settled(*c);
  EXPECT_EQ(st.prefix.disk.hits, kTurns);
  EXPECT_FALSE(st.prefix.redis.on);
}

TEST_P(PrefixRedis, KilledBeforeStartRecomputes) {
  const Conversation off = cache_off();
  populate(off);
  server_->kill9();
  auto b = make(redis_config());  // starts although nothing answers
  ASSERT_TRUE(b);
  const Conversation on = conversation(*b);
  for (int t = 0; t < kTurns; ++t) expect_same(on.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "killed redis, turn " + std::to_string(t));
  EXPECT_EQ(on.out[0].cached_tokens, 0);
  b->flush_prefix_tier();
  const ServiceStats st = settled(*b);
  EXPECT_EQ(st.prefix.redis.hits, 0);
  EXPECT_EQ(st.prefix.redis.hit_tokens, 0);
  EXPECT_GE(st.prefix.redis.read_errors, 1);
  EXPECT_GT(st.prefix.redis.write_errors, 0) << "its own prefixes could not be written";
  EXPECT_EQ(st.prefix.redis.written, 0);
}

TEST_P(PrefixRedis, KilledDuringConversationRecomputes) {
  const Conversation off = cache_off();
  populate(off);
  constexpr int kKillAt = 3;
  auto b = make(redis_config());
  ASSERT_TRUE(b);
  const Conversation on = conversation(*b, [&](int t) {
    if (t == kKillAt) server_->kill9();
  });
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "redis killed at turn 3, turn " + std::to_string(t));
    if (t < kKillAt) {
      EXPECT_EQ(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t;
    } else {
      // Afterwards only the live pools hit: the previous turn's prompt end, short of this turn's deepest boundary.
      EXPECT_LT(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t;
    }
  }
  b->flush_prefix_tier();
  const ServiceStats st = settled(*b);
  EXPECT_EQ(st.prefix.redis.hits, kKillAt);
  EXPECT_EQ(st.prefix.redis.hit_tokens, restorable(on, 0, kKillAt));
  EXPECT_GE(st.prefix.redis.read_errors, 1);
  EXPECT_GT(st.prefix.redis.write_errors, 0);
}

// SIGSTOP: the kernel still accepts connections, the server never answers; each lookup and write waits out the
// timeout at most, then the tier backs off. Every turn completes within a small multiple of the timeout.
TEST_P(PrefixRedis, StalledServerCostsAtMostTheTimeout) {
  const Conversation off = cache_off();
  populate(off);
  server_->pause();
  auto b = make(redis_config("", kTimeoutMs));
  ASSERT_TRUE(b);
  std::vector<Clock::duration> took;
  Clock::time_point t0;
  const auto start = Clock::now();
  const Conversation on = conversation(*b, [&](int t) {
    if (t > 0) took.push_back(Clock::now() - t0);
    t0 = Clock::now();
  });
  took.push_back(Clock::now() - t0);
  const auto elapsed = Clock::now() - start;
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "stalled redis, turn " + std::to_string(t));
    // Every request completes: a few timeouts of waiting at most, plus the turn's compute (generous: the machine
    // may be busy; the wait itself is bounded tightly below).
    EXPECT_LT(took[i], std::chrono::milliseconds(4 * kTimeoutMs + 5000)) << "turn " << t;
  }
  EXPECT_EQ(on.out[0].cached_tokens, 0);
  const ServiceStats st = settled(*b);
  EXPECT_EQ(st.prefix.redis.hits, 0);
  EXPECT_GE(st.prefix.redis.read_errors, 1);
  // One wait per back-off period, not one per boundary and admission: a lookup stops at its first error, and the
  // tier is not asked again for a second (PrefixCacheConfig::redis_backoff).
  EXPECT_LE(st.prefix.redis.read_errors, 1 + std::chrono::duration_cast<std::chrono::seconds>(elapsed).count())
      << "queries " << st.prefix.redis.queries << ", skipped " << st.prefix.redis.skipped;
  EXPECT_EQ(st.prefix.redis.queries + st.prefix.redis.skipped, kTurns) << "every admission asked or skipped";
  // An admission waits for its own connect and command and at most one write in flight on the shared connection,
  // each bounded by the timeout.
  // Without the bound an admission would wait for the whole stall (until resume()).
  EXPECT_LT(st.prefix.redis.lookup_max_ns, (int64_t{6} * kTimeoutMs + kSchedulingSlackMs) * 1000000) << "longest wait on Redis";
  EXPECT_GE(st.prefix.redis.lookup_max_ns, int64_t{kTimeoutMs - 50} * 1000000) << "the stalled server was waited for";
  server_->resume();
  b->flush_prefix_tier();
  b.reset();
  // Resumed: a fresh server hits again.
  auto c = make(redis_config());
  ASSERT_TRUE(c);
  const Conversation later = conversation(*c);
  for (int t = 0; t < kTurns; ++t) expect_same(later.out[static_cast<size_t>(t)], off.out[static_cast<size_t>(t)], "resumed redis, turn " + std::to_string(t));
  EXPECT_EQ(settled(*c).prefix.redis.hits, kTurns);
}

TEST_P(PrefixRedis, CorruptAndForeignObjectsAreNoHit) {
  const Conversation off = cache_off();
  populate(off);
  auto r = direct();
  // 1. Flip one byte in the pages object of the last turn's deepest boundary.
  const int at = deepest(off.prompts.back());
  const Digest last = last_segment_name(off.prompts.back(), at);
  {
    auto bytes = r->get(last);
    ASSERT_TRUE(bytes && bytes->has_value()) << "server A stored the boundary";
    std::vector<uint8_t> v = std::move(**bytes);
    v[v.size() / 2] ^= 0x01;
    ASSERT_TRUE(r->erase(last).is_ok());
    ASSERT_TRUE(r->put(last, v).is_ok());
  }
  // 2. Re-file the pages object of the turn before under a foreign model digest (a valid object, well framed, under
  // the right name: only the digest check can refuse it).
  const int at2 = deepest(off.prompts[kTurns - 2]);
  const Digest key2 = boundary_key(off.prompts[kTurns - 2], at2);
  const Digest before = last_segment_name(off.prompts[kTurns - 2], at2);
  {
    auto bytes = r->get(before);
    ASSERT_TRUE(bytes && bytes->has_value());
    auto obj = parse_tier_object(**bytes, key2, model_digest(full_fingerprint(kFingerprint)), TierPayloadKind::kPages);
    ASSERT_TRUE(obj) << obj.error().message();
    obj->model = model_digest(full_fingerprint("another-model"));
    ASSERT_TRUE(r->erase(before).is_ok());
    ASSERT_TRUE(r->put(before, serialize_tier_object(*obj)).is_ok());
  }
  auto b = make(redis_config());
  ASSERT_TRUE(b);
  const Conversation on = conversation(*b);
  for (int t = 0; t < kTurns; ++t) {
    const auto i = static_cast<size_t>(t);
    expect_same(on.out[i], off.out[i], "damaged redis, turn " + std::to_string(t));
    if (t < kTurns - 2) {
      EXPECT_EQ(on.out[i].cached_tokens, deepest(on.prompts[i])) << "turn " << t;
    }
  }
  // The damaged boundaries are not hit: those turns fall back to what the live pools hold (the turn before).
  EXPECT_LT(on.out[kTurns - 2].cached_tokens, at2);
  EXPECT_LT(on.out[kTurns - 1].cached_tokens, at);
  b->flush_prefix_tier();
  const ServiceStats st = settled(*b);
  EXPECT_EQ(st.prefix.redis.corrupt, 2) << "the flipped byte and the foreign model digest";
  // A pure-MLA boundary needs no snapshot: the turn before the last still restores the full segments it shares
  // with the last turn's boundary, deeper than the live pools.
  EXPECT_EQ(st.prefix.redis.hits, hybrid() ? kTurns - 2 : kTurns - 1);
  EXPECT_EQ(st.prefix.redis.read_errors, 0);
  // The corrupt object was deleted, and the turn's own prefill wrote that boundary again, whole.
  auto bytes = r->get(last);
  ASSERT_TRUE(bytes && bytes->has_value());
  EXPECT_TRUE(parse_tier_object(**bytes, boundary_key(off.prompts.back(), at), model_digest(full_fingerprint(kFingerprint)),
                                TierPayloadKind::kPages));
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixRedis, ::testing::Values("k3-tiny", "deepseek-v3-tiny"), param_name);

}  // namespace
}  // namespace kestrel
