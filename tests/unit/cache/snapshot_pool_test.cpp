// SnapshotPool: the fixed arena of KDA state snapshots (cache/snapshot_pool.h).
#include "cache/snapshot_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace kestrel {
namespace {

TEST(SnapshotPool, CapacityFromBudget) {
  auto p = SnapshotPool::create(1000, 4000 * 3 + 3999);  // 3 snapshots of 4000 bytes fit, not 4
  ASSERT_TRUE(p);
  EXPECT_EQ((*p)->capacity(), 3);
  EXPECT_EQ((*p)->free_count(), 3);
  EXPECT_EQ((*p)->floats(), 1000);
  EXPECT_EQ((*p)->bytes_used(), 0);
  EXPECT_EQ((*p)->arena_bytes(), 12000);
  auto small = SnapshotPool::create(1000, 3999);
  ASSERT_TRUE(small);
  EXPECT_EQ((*small)->capacity(), 0);
  EXPECT_FALSE((*small)->acquire().has_value());
  auto none = SnapshotPool::create(0, 1 << 20);  // a model without KDA layers
  ASSERT_TRUE(none);
  EXPECT_EQ((*none)->capacity(), 0);
  EXPECT_FALSE((*none)->acquire().has_value());
  EXPECT_FALSE(SnapshotPool::create(-1, 100));
  EXPECT_FALSE(SnapshotPool::create(10, -1));
}

TEST(SnapshotPool, AcquireReleaseExhaustion) {
  auto r = SnapshotPool::create(8, 8 * 4 * 4);
  ASSERT_TRUE(r);
  SnapshotPool& p = **r;
  std::set<int32_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = p.acquire();
    ASSERT_TRUE(id.has_value());
    EXPECT_GE(*id, 0);
    EXPECT_LT(*id, 4);
    ids.insert(*id);
    float* d = p.data(*id);
    for (int k = 0; k < 8; ++k) d[k] = static_cast<float>(*id * 100 + k);
  }
  EXPECT_EQ(ids.size(), 4u);  // distinct
  EXPECT_EQ(p.free_count(), 0);
  EXPECT_EQ(p.bytes_used(), 4 * 8 * 4);
  EXPECT_FALSE(p.acquire().has_value());
  // Arenas do not overlap: every snapshot still holds what was written to it.
  for (int32_t id : ids)
    for (int k = 0; k < 8; ++k) EXPECT_EQ(p.data(id)[k], static_cast<float>(id * 100 + k));
  p.release(2);
  EXPECT_EQ(p.free_count(), 1);
  EXPECT_FALSE(p.in_use(2));
  auto again = p.acquire();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, 2);
  EXPECT_FALSE(p.acquire().has_value());
}

TEST(SnapshotPoolDeathTest, DoubleReleaseDies) {
  auto r = SnapshotPool::create(4, 64);
  ASSERT_TRUE(r);
  SnapshotPool& p = **r;
  const int32_t id = *p.acquire();
  p.release(id);
  EXPECT_DEATH(p.release(id), "double release");
  EXPECT_DEATH(p.release(99), "out of range");
  EXPECT_DEATH(p.data(id), "not acquired");
}

}  // namespace
}  // namespace kestrel
