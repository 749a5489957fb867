// How the pages of one boundary are laid out in the lower tiers: as segments, objects of consecutive blocks of a
// bounded size, so that a longer prefix reuses the objects of the shorter ones it extends instead of storing all
// of its blocks again (content addressing: a segment is named by the key of its last block, which binds every
// token before it, and by its first block).
//
// The pages of blocks [0, n) are the segments [0, s), [s, 2s), ... of `s` blocks each, then the last one,
// [floor((n - 1) / s) * s, n), which holds 1 to s blocks. Every full segment is shared by all boundaries beyond
// it; the last one is the boundary's own unless n is a multiple of s. A boundary's pages are restorable only when
// every one of its segments is.
#pragma once

#include <cstdint>
#include <vector>


namespace kestrel {

struct PageSegment {
  int64_t first = 0;  // first block
  int64_t end = 0;    // one past the last block
  int64_t blocks() const { return end - first; }
};

// The segments of blocks [0, blocks) at `segment_blocks` (>= 1) blocks each; empty for blocks <= 0.
std::vector<PageSegment> page_segments(int64_t blocks, int64_t segment_blocks);

// The blocks per segment for a target object size: as many whole blocks as fit in `target_bytes`, at least one.
int64_t segment_blocks_for(int64_t block_bytes, int64_t target_bytes);
// The store name of a segment: tier_segment_key() in cache/tier_object.h.

}  // namespace kestrel
