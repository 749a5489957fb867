// The two per-request cache pools of a hybrid model (docs/architecture.md §3):
//   - KDA state slots: one slot per running sequence = conv history + fp32 recurrent state for
//     every KDA layer (constant size);
//   - MLA latent pages: blocks of `page_tokens` tokens; one block holds that many latent rows for
//     EVERY MLA layer, so a sequence's page table is one list of block ids.
//   - DSA indexer key pages (only when the model has sparse layers): their own arena of byte pages,
//     `page_tokens` key rows [e4m3 codes | fp32 scale] per sparse layer, addressed by the SAME block
//     id as the MLA pages (every cached token needs both), so one page table serves both pools.
// Sized once from a memory budget; no allocation afterwards. Plain data structure: not
// thread-safe (owned by the scheduler thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/result.h"
#include "models/model.h"

namespace kestrel {

struct CachePoolConfig {
  int64_t budget_bytes = 1ll << 30;  // both pools together
  int64_t page_tokens = 64;
  int max_slots = 16;                // concurrent sequences (KDA slots)
  int64_t max_seq_tokens = 32768;    // page tables are reserved for this many tokens
};

class CachePools {
 public:
  static Result<std::unique_ptr<CachePools>> create(const CacheGeometry& g, const CachePoolConfig& c);
  CachePools(const CachePools&) = delete;
  CachePools& operator=(const CachePools&) = delete;

  int num_slots() const { return static_cast<int>(slot_used_.size()); }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }
  int64_t num_blocks() const { return static_cast<int64_t>(block_free_flag_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  int64_t page_tokens() const { return cfg_.page_tokens; }
  int64_t slot_bytes() const { return geom_.slot_floats() * 4; }
  int64_t block_bytes() const { return block_floats_ * 4 + index_block_bytes_; }  // both pools
  int64_t mla_block_bytes() const { return block_floats_ * 4; }
  int64_t index_block_bytes() const { return index_block_bytes_; }
  // Blocks needed to hold n tokens.
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + cfg_.page_tokens - 1) / cfg_.page_tokens; }

  // Takes a slot, zeroes its state and points `s` (a fresh, non-owning SequenceState) at it.
  std::optional<int> acquire_slot(SequenceState& s);
  // Adds blocks to `s` until it can hold n_tokens; false (and no change) when the pool is short.
  bool grow(SequenceState& s, std::vector<int32_t>& blocks, int64_t n_tokens);
  // Returns the slot and blocks; `s` is reset to empty views.
  void release(SequenceState& s, int slot, std::vector<int32_t>& blocks);

 private:
  CachePools(const CacheGeometry& g, const CachePoolConfig& c) : geom_(g), cfg_(c) {}
  CacheGeometry geom_;
  CachePoolConfig cfg_;
  int64_t block_floats_ = 0;
  int64_t index_block_bytes_ = 0;
  std::unique_ptr<float[]> slot_mem_, block_mem_;
  std::unique_ptr<uint8_t[]> index_mem_;
  std::vector<int> free_slots_;
  std::vector<bool> slot_used_;
  std::vector<int32_t> free_blocks_;
  std::vector<bool> block_free_flag_;
};

}  // namespace kestrel
