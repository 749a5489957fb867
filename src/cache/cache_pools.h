// The two per-request cache pools of a hybrid model (docs/architecture.md §3):
//   - KDA state slots: one slot per running sequence = conv history + fp32 recurrent state for
//     every KDA layer (constant size);
//   - MLA latent pages: blocks of `page_tokens` tokens; one block holds that many latent rows for
//     EVERY MLA layer, so a sequence's page table is one list of block ids. Rows are stored in the
//     configured cache dtype (`kv_dtype`, kernels/cpu/kv_row.h): a block is bytes, whatever the dtype.
//   - DSA indexer key pages (only when the model has sparse layers): their own arena of byte pages,
//     `page_tokens` key rows [e4m3 codes | fp32 scale] per sparse layer, addressed by the SAME block
//     id as the MLA pages (every cached token needs both), so one page table serves both pools.
// Blocks are reference-counted: a sequence holds one reference on every block of its page table, and
// the prefix cache (cache/prefix_cache.h) one on every block it keeps; a block returns to the free list
// when the last reference goes. A block shared by several holders is only ever read: sharing covers
// full blocks, and a sequence writes only the positions after its cached prefix (its own blocks).
// Sized once from a memory budget; no allocation afterwards. Plain data structure: not
// thread-safe (owned by the scheduler thread).
// A ledger (create_ledger) sizes and allocates slots and blocks exactly as the pools of the same geometry and
// config do, but holds no memory and gives sequences no views: rank 0 of a serving cell keeps one per other rank
// (the bookkeeping of the pools that rank owns), and that rank takes the same slot and blocks in its own pools
// (take_slot, take_blocks) when the step plan names them (runtime/cell.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/result.h"
#include "cache/arena_source.h"
#include "models/model.h"
#include "runtime/cell.h"

namespace kestrel {

struct CachePoolConfig {
  int64_t budget_bytes = 1ll << 30;  // both pools together
  int64_t page_tokens = 64;
  int max_slots = 16;                // concurrent sequences (KDA slots)
  int64_t max_seq_tokens = 32768;    // page tables are reserved for this many tokens
  KvCacheDtype kv_dtype = KvCacheDtype::kF32;  // MLA latent rows (--kv-cache-dtype)
  std::shared_ptr<ArenaSource> arenas;  // where the arenas' memory comes from; null: the heap
};

class CachePools final : public CellPools {
 public:
  static Result<std::unique_ptr<CachePools>> create(const CacheGeometry& g, const CachePoolConfig& c);
  static Result<std::unique_ptr<CachePools>> create_ledger(const CacheGeometry& g, const CachePoolConfig& c);
  CachePools(const CachePools&) = delete;
  CachePools& operator=(const CachePools&) = delete;

  bool is_ledger() const { return ledger_; }
  // Bytes of cache memory (KDA slots, MLA pages, indexer pages) pools of this size hold.
  int64_t arena_bytes() const { return slot_bytes() * num_slots() + block_bytes() * num_blocks(); }
  int num_slots() const { return static_cast<int>(slot_used_.size()); }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }
  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  int64_t page_tokens() const { return cfg_.page_tokens; }
  KvCacheDtype kv_dtype() const { return cfg_.kv_dtype; }
  int64_t slot_bytes() const { return geom_.slot_floats() * 4; }
  int64_t block_bytes() const { return mla_block_bytes_ + index_block_bytes_; }  // both pools
  int64_t mla_block_bytes() const { return mla_block_bytes_; }
  int64_t index_block_bytes() const { return index_block_bytes_; }
  // Blocks needed to hold n tokens.
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + cfg_.page_tokens - 1) / cfg_.page_tokens; }

  // Takes a slot, zeroes its state and points `s` (a fresh, non-owning SequenceState) at it.
  std::optional<int> acquire_slot(SequenceState& s);
  // Adds blocks to `s` until it can hold n_tokens; false (and no change) when the pool is short.
  bool grow(SequenceState& s, std::vector<int32_t>& blocks, int64_t n_tokens);
  // A cell's follower rank: takes `slot` as acquire_slot would (zeroed state, views in `s`), and appends the
  // named blocks (one reference each) to `s` and `blocks`. False (and no change) when the slot or a block is
  // not free: the ledger that chose them disagrees with these pools.
  bool take_slot(SequenceState& s, int slot) override;
  bool take_blocks(SequenceState& s, std::vector<int32_t>& blocks, std::span<const int32_t> more) override;
  // Returns the slot and drops the sequence's reference on each of its blocks; `s` is reset to empty views.
  void release(SequenceState& s, int slot, std::vector<int32_t>& blocks) override;

  // Prefix-cache support.
  // Makes a freshly acquired `s` (no blocks, no tokens) start with `shared` blocks already filled by an
  // earlier sequence: the blocks are appended to its page table with one more reference each, and every
  // MLA / indexer cache and `s` itself count n_tokens = shared.size() * page_tokens.
  void adopt_prefix(SequenceState& s, std::vector<int32_t>& blocks, std::span<const int32_t> shared);
  // Disaggregation: `s` (acquired, with blocks for n_tokens) now holds n_tokens tokens that were written into
  // its slot and pages from outside (another instance's state); every MLA / indexer cache counts them.
  void mark_filled(SequenceState& s, std::span<const int32_t> blocks, int64_t n_tokens);
  // The pools' memory, fixed for their life (registered with a transport once): every KDA slot (slot s at
  // s * slot_bytes()), every block's MLA pages (block b at b * mla_block_bytes()), every block's indexer pages
  // (b * index_block_bytes(); empty without sparse layers).
  std::span<std::byte> slot_arena();
  std::span<std::byte> mla_arena();
  std::span<std::byte> index_arena();
  const CacheGeometry& geometry() const { return geom_; }
  void add_ref(int32_t block);
  void drop_ref(int32_t block);  // frees the block at zero
  int32_t refs(int32_t block) const { return refs_[static_cast<size_t>(block)]; }
  // The KDA state of a slot (conv + recurrent of every KDA layer, slot_floats() floats).
  float* slot_data(int slot) { return slot_mem_ + static_cast<int64_t>(slot) * geom_.slot_floats(); }
  int64_t slot_floats() const { return geom_.slot_floats(); }
  // Lower tiers (cache/tier_object.h): a block's bytes, block_bytes() of them: its MLA page of every MLA layer
  // (mla_block_bytes()), then its indexer page of every sparse layer (index_block_bytes()).
  void read_block(int32_t block, uint8_t* dst) const;
  void write_block(int32_t block, const uint8_t* src);
  // Takes a free block with one reference (the caller's); -1 when none is free.
  int32_t alloc_block();

 private:
  CachePools(const CacheGeometry& g, const CachePoolConfig& c) : geom_(g), cfg_(c) {}
  static Result<std::unique_ptr<CachePools>> make(const CacheGeometry& g, const CachePoolConfig& c, bool ledger);
  void append_views(SequenceState& s, int32_t block);
  void bind_slot(SequenceState& s, int slot);
  bool ledger_ = false;
  CacheGeometry geom_;
  CachePoolConfig cfg_;
  int64_t mla_block_bytes_ = 0;
  int64_t index_block_bytes_ = 0;
  // The arenas (into memory_, which holds them).
  float* slot_mem_ = nullptr;
  uint8_t* block_mem_ = nullptr;
  uint8_t* index_mem_ = nullptr;
  std::vector<std::shared_ptr<std::byte>> memory_;
  std::vector<int> free_slots_;
  std::vector<bool> slot_used_;
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> refs_;  // per block; 0 = free
};

}  // namespace kestrel
