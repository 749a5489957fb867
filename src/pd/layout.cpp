#include "pd/layout.h"

#include "pd/first_token.h"

namespace kestrel::pd {

std::vector<PoolRange> handoff_layout(const CachePools& pools, const CacheLocation& loc) {
  std::vector<PoolRange> out;
  const auto mla = static_cast<size_t>(pools.mla_block_bytes()), index = static_cast<size_t>(pools.index_block_bytes());
  const int64_t n_blocks = pools.blocks_for(loc.n_tokens);
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = static_cast<size_t>(loc.blocks[static_cast<size_t>(i)]);
    out.push_back({Pool::kMla, Part::kMla, b * mla, mla});
    if (index > 0) out.push_back({Pool::kIndex, Part::kIndex, b * index, index});
  }
  const CacheGeometry& g = pools.geometry();
  size_t at = static_cast<size_t>(loc.slot) * static_cast<size_t>(pools.slot_bytes());
  const auto conv = static_cast<size_t>(g.kda_conv_floats) * 4, rec = static_cast<size_t>(g.kda_recurrent_floats) * 4;
  for (size_t l = 0; l < g.kda_layers.size(); ++l) {  // the slot's layout (CachePools::acquire_slot)
    out.push_back({Pool::kSlots, Part::kConv, at, conv});
    out.push_back({Pool::kSlots, Part::kRecurrent, at + conv, rec});
    at += conv + rec;
  }
  out.push_back({Pool::kRecord, Part::kRecord, static_cast<size_t>(loc.slot) * kRecordBytes, kRecordBytes});
  return out;
}

}  // namespace kestrel::pd
