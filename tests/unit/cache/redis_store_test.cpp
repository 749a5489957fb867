// RedisStore: the shared tier (cache/redis_store.h) against a real redis-server that each test starts on its own
// socket and stops (KESTREL_REDIS_SERVER names the binary; default: redis-server on PATH). Without one the tests
// skip, or fail where CI (or KESTREL_CI) is set, as the chat page test does without a browser.
#include "cache/redis_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "common/redis_server.h"
#include "tier_test_util.h"

namespace kestrel {
namespace {

using tiertest::bytes_of;
using tiertest::key_of;
using Clock = std::chrono::steady_clock;
using testing::free_tcp_port;
using testing::RedisServer;

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KESTREL_REQUIRE_REDIS_SERVER(bin);
    server_ = std::make_unique<RedisServer>(bin, dir_.path(), tcp_port());
    ASSERT_TRUE(server_->start()) << "redis-server did not start; log in " << dir_.path() << "/redis.log";
  }
  virtual int tcp_port() { return 0; }  // unix socket only

  std::unique_ptr<RedisStore> store(int timeout_ms = 500, bool tcp = false, std::string prefix = "kestrel:v1:") {
    RedisStoreOptions o;
    if (tcp) {
      o.port = server_->port();
    } else {
      o.unix_socket = server_->socket();
    }
    o.key_prefix = std::move(prefix);
    o.connect_timeout_ms = timeout_ms;
    o.command_timeout_ms = timeout_ms;
    auto s = RedisStore::create(o);
    EXPECT_TRUE(s);
    return std::move(*s);
  }

  tiertest::ScratchDir dir_;
  std::unique_ptr<RedisServer> server_;
};

TEST_F(RedisStoreTest, PutGetContainsErase) {
  auto s = store();
  EXPECT_EQ(s->redis_key(key_of(1)), "kestrel:v1:" + to_hex(key_of(1)));
  auto miss = s->get(key_of(1));
  ASSERT_TRUE(miss) << miss.error().message();
  EXPECT_FALSE(miss->has_value());
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 1000)).is_ok());
  EXPECT_TRUE(*s->contains(key_of(1)));
  EXPECT_FALSE(*s->contains(key_of(2)));
  auto hit = s->get(key_of(1));
  ASSERT_TRUE(hit && hit->has_value());
  EXPECT_EQ(**hit, bytes_of(1, 1000));
  // Immutable: a second put of the key changes nothing.
  ASSERT_TRUE(s->put(key_of(1), bytes_of(2, 10)).is_ok());
  EXPECT_EQ(**s->get(key_of(1)), bytes_of(1, 1000));
  ASSERT_TRUE(s->erase(key_of(1)).is_ok());
  EXPECT_FALSE(*s->contains(key_of(1)));
  const TierStoreStats st = s->stats();
  EXPECT_EQ(st.objects, -1);
  EXPECT_EQ(st.writes, 1);
  EXPECT_EQ(st.duplicates, 1);
  EXPECT_EQ(st.reads, 3);
  EXPECT_EQ(st.hits, 2);
  EXPECT_EQ(st.read_bytes, 2000);
  EXPECT_EQ(st.write_bytes, 1000);
  EXPECT_EQ(st.errors, 0);
  EXPECT_GT(st.read_ns, 0);
  EXPECT_EQ(s->connects(), 1);
}

TEST_F(RedisStoreTest, BinaryAndLargeObjectsRoundTrip) {
  auto s = store();
  std::vector<uint8_t> big = bytes_of(7, 8 << 20);
  big[0] = 0;
  big[1] = '\r';
  big[2] = '\n';
  ASSERT_TRUE(s->put(key_of(7), big).is_ok());
  auto g = s->get(key_of(7));
  ASSERT_TRUE(g && g->has_value()) << (g ? "miss" : g.error().message());
  EXPECT_TRUE(**g == big);
}

TEST_F(RedisStoreTest, TwoConnectionsShareObjectsAndPrefixesSeparate) {
  auto a = store();
  auto b = store();
  auto other = store(500, false, "other:");
  ASSERT_TRUE(a->put(key_of(1), bytes_of(1, 64)).is_ok());
  ASSERT_TRUE(b->put(key_of(2), bytes_of(2, 64)).is_ok());
  EXPECT_EQ(**b->get(key_of(1)), bytes_of(1, 64));
  EXPECT_EQ(**a->get(key_of(2)), bytes_of(2, 64));
  ASSERT_TRUE(b->put(key_of(1), bytes_of(3, 64)).is_ok());  // the first writer wins
  EXPECT_EQ(b->stats().duplicates, 1);
  EXPECT_EQ(**a->get(key_of(1)), bytes_of(1, 64));
  EXPECT_FALSE(*other->contains(key_of(1)));
}

TEST_F(RedisStoreTest, KilledServerGivesErrorsThenReconnects) {
  auto s = store(300);
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 100)).is_ok());
  server_->kill9();
  const auto t0 = Clock::now();
  auto g = s->get(key_of(1));  // the write to a dead peer raises SIGPIPE: it must not end this process
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(s->put(key_of(2), bytes_of(2, 100)).is_ok());
  EXPECT_FALSE(s->contains(key_of(1)));
  EXPECT_FALSE(s->erase(key_of(1)).is_ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(s->stats().errors, 4);
  // The next call after the restart connects again (the data went with the server: no persistence).
  ASSERT_TRUE(server_->start());
  auto again = s->get(key_of(1));
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_FALSE(again->has_value());
  EXPECT_TRUE(s->put(key_of(1), bytes_of(1, 100)).is_ok());
  EXPECT_EQ(**s->get(key_of(1)), bytes_of(1, 100));
  EXPECT_EQ(s->connects(), 2);
  EXPECT_EQ(s->stats().errors, 4);
}

TEST_F(RedisStoreTest, NoServerIsAnErrorNotAHang) {
  RedisStoreOptions o;
  o.unix_socket = dir_.path() + "/nobody.sock";
  auto s = RedisStore::create(o);
  ASSERT_TRUE(s);
  auto g = (*s)->get(key_of(1));
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(g.error().message().find("cannot connect"), std::string::npos) << g.error().message();
  EXPECT_EQ((*s)->stats().errors, 1);
  RedisStoreOptions nowhere;
  nowhere.host = "";
  EXPECT_FALSE(RedisStore::create(nowhere));
}

// The stalled-server case over TCP, as a remote store would be reached: the kernel still accepts connections to a
// stopped process, so only the command timeout can end the wait.
class RedisStoreTcpTest : public RedisStoreTest {
 protected:
  int tcp_port() override { return free_tcp_port(); }
};

TEST_F(RedisStoreTcpTest, StalledServerTimesOutThenRecovers) {
  constexpr int kTimeoutMs = 300;
  auto s = store(kTimeoutMs, /*tcp=*/true);
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 100)).is_ok());
  server_->pause();
  auto t0 = Clock::now();
  auto g = s->get(key_of(1));
  auto waited = Clock::now() - t0;
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code(), StatusCode::kUnavailable);
  EXPECT_GE(waited, std::chrono::milliseconds(kTimeoutMs - 50));
  EXPECT_LT(waited, std::chrono::milliseconds(kTimeoutMs * 4));
  // A new connection to the stalled server: connect succeeds (backlog), the command times out.
  auto fresh = store(kTimeoutMs, /*tcp=*/true);
  t0 = Clock::now();
  EXPECT_FALSE(fresh->put(key_of(2), bytes_of(2, 100)).is_ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(kTimeoutMs * 4 + 2 * kTimeoutMs));
  EXPECT_EQ(s->stats().errors, 1);
  server_->resume();
  auto after = s->get(key_of(1));
  ASSERT_TRUE(after) << after.error().message();
  ASSERT_TRUE(after->has_value());
  EXPECT_EQ(**after, bytes_of(1, 100));
  EXPECT_EQ(s->connects(), 2);
}

}  // namespace
}  // namespace kestrel
