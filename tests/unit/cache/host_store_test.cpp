// HostStore: the host-memory tier (cache/host_store.h).
#include "cache/host_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "tier_test_util.h"

namespace kestrel {
namespace {

using tiertest::bytes_of;
using tiertest::key_of;

std::unique_ptr<HostStore> make_store(int64_t budget) {
  auto s = HostStore::create(HostStoreOptions{budget});
  EXPECT_TRUE(s) << s.error().message();
  return s ? std::move(*s) : nullptr;
}

std::optional<std::vector<uint8_t>> must_get(HostStore& s, const Digest& k) {
  auto r = s.get(k);
  EXPECT_TRUE(r) << r.error().message();
  return r ? *r : std::nullopt;
}

bool holds(HostStore& s, uint32_t k) { return *s.contains(key_of(k)); }

TEST(HostStore, ZeroOrNegativeBudgetIsRefused) {
  EXPECT_FALSE(HostStore::create(HostStoreOptions{0}));
  EXPECT_FALSE(HostStore::create(HostStoreOptions{-1}));
}

TEST(HostStore, PutGetContainsErase) {
  auto s = make_store(1 << 20);
  ASSERT_TRUE(s);
  const auto a = bytes_of(1, 1000);
  EXPECT_FALSE(must_get(*s, key_of(1)).has_value());
  ASSERT_TRUE(s->put(key_of(1), a).is_ok());
  EXPECT_TRUE(holds(*s, 1));
  EXPECT_FALSE(holds(*s, 2));
  EXPECT_EQ(must_get(*s, key_of(1)), a);
  TierStoreStats st = s->stats();
  EXPECT_EQ(st.objects, 1);
  EXPECT_EQ(st.bytes, 1000);
  EXPECT_EQ(st.writes, 1);
  EXPECT_EQ(st.write_bytes, 1000);
  EXPECT_EQ(st.reads, 2);
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.read_bytes, 1000);
  EXPECT_EQ(st.errors, 0);
  ASSERT_TRUE(s->erase(key_of(1)).is_ok());
  ASSERT_TRUE(s->erase(key_of(1)).is_ok());  // absent is fine
  EXPECT_FALSE(holds(*s, 1));
  EXPECT_FALSE(must_get(*s, key_of(1)).has_value());
  EXPECT_EQ(s->stats().objects, 0);
  EXPECT_EQ(s->stats().bytes, 0);
  EXPECT_EQ(s->stats().evictions, 0) << "an erase is not an eviction";
}

TEST(HostStore, PutOfAStoredKeyIsANoOp) {
  auto s = make_store(1 << 20);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 100)).is_ok());
  ASSERT_TRUE(s->put(key_of(1), bytes_of(2, 300)).is_ok());  // other bytes: still the first object
  ASSERT_TRUE(s->put_owned(key_of(1), bytes_of(3, 50)).is_ok());
  EXPECT_EQ(must_get(*s, key_of(1)), bytes_of(1, 100));
  const TierStoreStats st = s->stats();
  EXPECT_EQ(st.writes, 1);
  EXPECT_EQ(st.duplicates, 2);
  EXPECT_EQ(st.bytes, 100);
  EXPECT_EQ(st.write_bytes, 100);
}

TEST(HostStore, SharedReadsAreTheStoredBufferAndOutliveEviction) {
  auto s = make_store(1000);
  ASSERT_TRUE(s);
  std::vector<uint8_t> a = bytes_of(1, 600);
  const uint8_t* where = a.data();
  ASSERT_TRUE(s->put_owned(key_of(1), std::move(a)).is_ok());
  auto r1 = s->get_shared(key_of(1));
  auto r2 = s->get_shared(key_of(1));
  ASSERT_TRUE(r1 && *r1 && r2 && *r2);
  EXPECT_EQ(r1->get(), r2->get()) << "no copy per read";
  EXPECT_EQ((*r1)->data(), where) << "put_owned keeps the caller's buffer";
  ASSERT_TRUE(s->put(key_of(2), bytes_of(2, 600)).is_ok());  // evicts 1
  EXPECT_FALSE(holds(*s, 1));
  EXPECT_EQ(**r1, bytes_of(1, 600)) << "a reader keeps the bytes it holds";
  auto miss = s->get_shared(key_of(1));
  ASSERT_TRUE(miss);
  EXPECT_EQ(*miss, nullptr);
  EXPECT_EQ(s->stats().hits, 2);
  EXPECT_EQ(s->stats().reads, 3);
}

TEST(HostStore, EvictsLeastRecentlyUsedToStayInBudget) {
  auto s = make_store(3000);
  ASSERT_TRUE(s);
  for (uint32_t k = 1; k <= 3; ++k) ASSERT_TRUE(s->put(key_of(k), bytes_of(k, 1000)).is_ok());
  // Recency: 3 > 2 > 1. A read of 1 and a touch of 2 make the order 2 > 1 > 3; contains() changes nothing.
  EXPECT_TRUE(must_get(*s, key_of(1)).has_value());
  s->touch(key_of(2));
  EXPECT_TRUE(holds(*s, 3));
  s->touch(key_of(99));  // absent: nothing
  ASSERT_TRUE(s->put(key_of(4), bytes_of(4, 1000)).is_ok());
  EXPECT_FALSE(holds(*s, 3)) << "the least recently used goes first";
  EXPECT_TRUE(holds(*s, 1));
  EXPECT_TRUE(holds(*s, 2));
  EXPECT_TRUE(holds(*s, 4));
  // A larger object makes room by as many as it needs, oldest first: 1, then 2.
  ASSERT_TRUE(s->put(key_of(5), bytes_of(5, 2000)).is_ok());
  EXPECT_FALSE(holds(*s, 1));
  EXPECT_FALSE(holds(*s, 2));
  EXPECT_TRUE(holds(*s, 4));
  EXPECT_TRUE(holds(*s, 5));
  const TierStoreStats st = s->stats();
  EXPECT_EQ(st.evictions, 3);
  EXPECT_EQ(st.bytes, 3000);
  EXPECT_EQ(st.objects, 2);
}

TEST(HostStore, ObjectLargerThanTheBudgetIsRefused) {
  auto s = make_store(1000);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 500)).is_ok());
  const Status st = s->put(key_of(2), bytes_of(2, 1001));
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_EQ(s->put_owned(key_of(3), bytes_of(3, 5000)).code(), StatusCode::kTooLarge);
  EXPECT_TRUE(holds(*s, 1)) << "a refused object evicts nothing";
  EXPECT_FALSE(holds(*s, 2));
  EXPECT_EQ(s->stats().errors, 2);
  EXPECT_EQ(s->stats().evictions, 0);
  EXPECT_EQ(s->stats().bytes, 500);
  ASSERT_TRUE(s->put(key_of(4), bytes_of(4, 1000)).is_ok()) << "exactly the budget fits";
  EXPECT_EQ(s->stats().objects, 1);
}

TEST(HostStore, ConcurrentWritersAndReadersStayConsistent) {
  auto s = make_store(40 * 500);
  ASSERT_TRUE(s);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&s, t] {
      for (uint32_t i = 0; i < 2000; ++i) {
        const uint32_t k = (i * 7 + static_cast<uint32_t>(t)) % 100;  // overlapping keys across threads
        EXPECT_TRUE((t % 2 ? s->put(key_of(k), bytes_of(k, 500)) : s->put_owned(key_of(k), bytes_of(k, 500))).is_ok());
        auto g = s->get_shared(key_of((k + 3) % 100));
        ASSERT_TRUE(g);
        if (*g) {
          EXPECT_EQ(**g, bytes_of((k + 3) % 100, 500));
        }
        if (i % 17 == 0) {
          EXPECT_TRUE(s->erase(key_of((k + 5) % 100)).is_ok());
        }
        s->touch(key_of((k + 1) % 100));
      }
    });
  }
  for (auto& th : threads) th.join();
  const TierStoreStats st = s->stats();
  EXPECT_LE(st.bytes, 40 * 500);
  EXPECT_EQ(st.bytes, st.objects * 500);
  EXPECT_EQ(st.errors, 0);
  EXPECT_EQ(st.writes + st.duplicates, 4 * 2000);
  EXPECT_EQ(st.reads, 4 * 2000);
  int held = 0;
  for (uint32_t k = 0; k < 100; ++k) held += holds(*s, k) ? 1 : 0;
  EXPECT_EQ(held, st.objects);
}

}  // namespace
}  // namespace kestrel
