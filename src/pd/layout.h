// The bytes of one request's state that move from a prefill instance to a decode instance, as ranges over the
// scheduler's cache pools, in an order both sides derive from the model alone (so the i-th source of the prefill
// pairs with the i-th destination of the decode, whatever blocks and slot each side holds):
//   for every block of the page table, in order: its MLA pages (every MLA layer), then its DSA indexer pages
//   (every sparse layer; none without sparse layers);
//   for every KDA layer, in order: its conv state, then its recurrent state (the request's slot);
//   the first-token record (first_token.h).
// Pages are moved whole; the rows past the prompt's last token are never read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/cache_pools.h"
#include "scheduler/request.h"

namespace kestrel::pd {

enum class Pool : uint8_t { kSlots, kMla, kIndex, kRecord };
// What a range holds (tests zero one part on purpose to prove it matters).
enum class Part : uint8_t { kMla, kIndex, kConv, kRecurrent, kRecord };

struct PoolRange {
  Pool pool;
  Part part;
  size_t offset = 0;  // into the pool's arena (CachePools::*_arena(); the record arena: slot * kRecordBytes)
  size_t length = 0;
};

std::vector<PoolRange> handoff_layout(const CachePools& pools, const CacheLocation& loc);

}  // namespace kestrel::pd
