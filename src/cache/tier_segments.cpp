// Segments of a boundary's pages in the lower tiers. See tier_segments.h.
#include "cache/tier_segments.h"

#include <algorithm>

#include "base/check.h"

namespace kestrel {

std::vector<PageSegment> page_segments(int64_t blocks, int64_t segment_blocks) {
  KCHECK(segment_blocks >= 1, "page_segments: a segment holds at least one block");
  std::vector<PageSegment> out;
  if (blocks <= 0) return out;
  out.reserve(static_cast<size_t>((blocks + segment_blocks - 1) / segment_blocks));
  for (int64_t f = 0; f < blocks; f += segment_blocks) out.push_back({f, std::min(blocks, f + segment_blocks)});
  return out;
}

int64_t segment_blocks_for(int64_t block_bytes, int64_t target_bytes) {
  KCHECK(block_bytes > 0, "segment_blocks_for: blocks have bytes");
  return std::max<int64_t>(1, target_bytes / block_bytes);
}

}  // namespace kestrel
