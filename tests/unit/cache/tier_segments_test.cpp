// The segments a boundary's pages are stored as in the lower tiers (cache/tier_segments.h), and their names.
#include "cache/tier_segments.h"

#include <gtest/gtest.h>

#include <set>

#include "cache/tier_object.h"
#include "tier_test_util.h"

namespace kestrel {
namespace {

TEST(TierSegments, CoverTheBlocksInOrderWithOnlyTheLastShort) {
  for (int64_t s = 1; s <= 5; ++s) {
    for (int64_t n = 0; n <= 17; ++n) {
      const auto parts = page_segments(n, s);
      int64_t next = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_EQ(parts[i].first, next) << "n=" << n << " s=" << s;
        EXPECT_EQ(parts[i].first % s, 0) << "segments start on the segment grid";
        EXPECT_GE(parts[i].blocks(), 1);
        EXPECT_EQ(parts[i].blocks() == s, i + 1 < parts.size() || n % s == 0) << "n=" << n << " s=" << s;
        next = parts[i].end;
      }
      EXPECT_EQ(next, n);
      EXPECT_EQ(static_cast<int64_t>(parts.size()), (n + s - 1) / s);
    }
  }
}

TEST(TierSegments, ALongerPrefixReusesEveryFullSegmentOfAShorterOne) {
  // Boundaries at 9 and 14 blocks, segments of 4: [0,4) [4,8) are shared, [8,9) and [8,12) [12,14) are not.
  const auto a = page_segments(9, 4), b = page_segments(14, 4);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(a[i].first == b[i].first && a[i].end == b[i].end);
  EXPECT_EQ(a[2].end, 9);
  EXPECT_EQ(b[2].end, 12);
}

TEST(TierSegments, BlocksPerSegmentFollowTheTargetBytes) {
  EXPECT_EQ(segment_blocks_for(1000, 4000), 4);
  EXPECT_EQ(segment_blocks_for(1000, 4999), 4);
  EXPECT_EQ(segment_blocks_for(1000, 999), 1) << "a block larger than the target is one object";
  EXPECT_EQ(segment_blocks_for(9 << 20, 4 << 20), 1);
}

TEST(TierSegments, NamesBindTheEndKeyAndTheFirstBlock) {
  const Digest k = tiertest::key_of(7);
  EXPECT_EQ(tier_segment_key(k, 0), tier_store_key(k, TierPayloadKind::kPages))
      << "a segment from block 0 is the boundary's pages object";
  std::set<Digest> names;
  for (int64_t first = 0; first < 64; ++first) names.insert(tier_segment_key(k, first));
  for (int d = 0; d < 8; ++d) names.insert(tier_segment_key(tiertest::key_of(d + 100), 3));
  names.insert(tier_store_key(k, TierPayloadKind::kSnapshot));
  EXPECT_EQ(names.size(), 64u + 8u + 1u);
  EXPECT_EQ(tier_segment_key(k, 5), tier_segment_key(k, 5));
}

}  // namespace
}  // namespace kestrel
