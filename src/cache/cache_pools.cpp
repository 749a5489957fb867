#include "cache/cache_pools.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace kestrel {

Result<std::unique_ptr<CachePools>> CachePools::create(const CacheGeometry& g, const CachePoolConfig& c) {
  return make(g, c, false);
}

Result<std::unique_ptr<CachePools>> CachePools::create_ledger(const CacheGeometry& g, const CachePoolConfig& c) {
  return make(g, c, true);
}

Result<std::unique_ptr<CachePools>> CachePools::make(const CacheGeometry& g, const CachePoolConfig& c, bool ledger) {
  if (c.page_tokens <= 0 || c.max_slots <= 0) return invalid_argument("cache: page size and slots must be positive");
  auto p = std::unique_ptr<CachePools>(new CachePools(g, c));
  const int64_t slot_bytes = g.slot_floats() * 4;
  p->mla_block_bytes_ = std::max<int64_t>(4, c.page_tokens * g.mla_bytes_per_token(c.kv_dtype));
  p->index_block_bytes_ = static_cast<int64_t>(g.sparse_layers.size()) * c.page_tokens * g.index_row_bytes;
  const int64_t slots_bytes = slot_bytes * c.max_slots;
  if (slots_bytes >= c.budget_bytes)
    return invalid_argument("cache: budget " + std::to_string(c.budget_bytes >> 20) + " MiB cannot hold " +
                            std::to_string(c.max_slots) + " KDA state slots (" + std::to_string(slot_bytes >> 10) +
                            " KiB each); raise --cache-mib or lower --max-running");
  const int64_t blocks = (c.budget_bytes - slots_bytes) / p->block_bytes();
  if (blocks < 1) return invalid_argument("cache: budget leaves no room for MLA pages");
  p->ledger_ = ledger;
  p->slot_used_.assign(static_cast<size_t>(c.max_slots), false);
  for (int i = c.max_slots - 1; i >= 0; --i) p->free_slots_.push_back(i);
  p->refs_.assign(static_cast<size_t>(blocks), 0);
  p->free_blocks_.reserve(static_cast<size_t>(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) p->free_blocks_.push_back(static_cast<int32_t>(b));
  if (ledger) return p;
  // Heap memory is default-initialised (new T[n], not make_unique): pages are touched only when used, so the
  // resident size follows the load, not the budget. Slots are zeroed on acquire.
  auto take = [&](size_t bytes, const char* what) -> Result<std::byte*> {
    std::shared_ptr<std::byte> m;
    if (c.arenas != nullptr) {
      auto r = c.arenas->allocate(bytes, what);
      if (!r) return r.error();
      m = std::move(*r);
    } else {
      m = std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
    }
    p->memory_.push_back(m);
    return m.get();
  };
  auto slots = take(static_cast<size_t>(std::max<int64_t>(1, g.slot_floats() * c.max_slots)) * sizeof(float), "KDA slots");
  if (!slots) return slots.error();
  p->slot_mem_ = reinterpret_cast<float*>(*slots);
  auto mla = take(static_cast<size_t>(blocks * p->mla_block_bytes_), "MLA pages");
  if (!mla) return mla.error();
  p->block_mem_ = reinterpret_cast<uint8_t*>(*mla);
  if (p->index_block_bytes_ > 0) {
    auto index = take(static_cast<size_t>(blocks * p->index_block_bytes_), "indexer pages");
    if (!index) return index.error();
    p->index_mem_ = reinterpret_cast<uint8_t*>(*index);
  }
  return p;
}

std::optional<int> CachePools::acquire_slot(SequenceState& s) {
  if (free_slots_.empty()) return std::nullopt;
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  slot_used_[static_cast<size_t>(slot)] = true;
  bind_slot(s, slot);
  return slot;
}

bool CachePools::take_slot(SequenceState& s, int slot) {
  if (slot < 0 || slot >= num_slots() || slot_used_[static_cast<size_t>(slot)]) return false;
  free_slots_.erase(std::find(free_slots_.begin(), free_slots_.end(), slot));
  slot_used_[static_cast<size_t>(slot)] = true;
  bind_slot(s, slot);
  return true;
}

// Points `s` at the slot's (zeroed) KDA state and readies its page tables; a ledger's sequence gets no views.
void CachePools::bind_slot(SequenceState& s, int slot) {
  s.owns_storage = false;
  s.n_tokens = 0;
  if (ledger_) return;
  const size_t layers = static_cast<size_t>(std::max(geom_.kda_layers.empty() ? 0 : geom_.kda_layers.back() + 1,
                                                      geom_.mla_layers.empty() ? 0 : geom_.mla_layers.back() + 1));
  s.kda.assign(layers, KdaState{});
  s.mla.assign(layers, MlaCache{});
  float* p = slot_mem_ + static_cast<int64_t>(slot) * geom_.slot_floats();
  for (int l : geom_.kda_layers) {
    KdaState& k = s.kda[static_cast<size_t>(l)];
    k.conv = p;
    p += geom_.kda_conv_floats;
    k.recurrent = p;
    p += geom_.kda_recurrent_floats;
  }
  std::fill(slot_mem_ + static_cast<int64_t>(slot) * geom_.slot_floats(), p, 0.0f);
  for (int l : geom_.mla_layers) {
    s.mla[static_cast<size_t>(l)].page_tokens = cfg_.page_tokens;
    s.mla[static_cast<size_t>(l)].row = geom_.mla_row(cfg_.kv_dtype);
    s.mla[static_cast<size_t>(l)].pages.reserve(static_cast<size_t>(blocks_for(cfg_.max_seq_tokens)));
  }
  for (int l : geom_.sparse_layers) {
    IndexerCache& ic = s.mla[static_cast<size_t>(l)].indexer;
    ic.page_tokens = cfg_.page_tokens;
    ic.pages.reserve(static_cast<size_t>(blocks_for(cfg_.max_seq_tokens)));
  }
}

bool CachePools::grow(SequenceState& s, std::vector<int32_t>& blocks, int64_t n_tokens) {
  const int64_t need = blocks_for(n_tokens) - static_cast<int64_t>(blocks.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = free_blocks_.back();
    free_blocks_.pop_back();
    refs_[static_cast<size_t>(b)] = 1;
    blocks.push_back(b);
    append_views(s, b);
  }
  return true;
}

bool CachePools::take_blocks(SequenceState& s, std::vector<int32_t>& blocks, std::span<const int32_t> more) {
  for (size_t i = 0; i < more.size(); ++i) {
    const int32_t b = more[i];
    if (b < 0 || b >= num_blocks() || refs_[static_cast<size_t>(b)] != 0 ||
        std::find(more.begin(), more.begin() + static_cast<long>(i), b) != more.begin() + static_cast<long>(i))
      return false;
  }
  for (int32_t b : more) {
    free_blocks_.erase(std::find(free_blocks_.begin(), free_blocks_.end(), b));
    refs_[static_cast<size_t>(b)] = 1;
    blocks.push_back(b);
    append_views(s, b);
  }
  return true;
}

// Appends block b's page of every MLA layer and every indexer to the sequence's page tables.
void CachePools::append_views(SequenceState& s, int32_t b) {
  if (ledger_) return;
  uint8_t* base = block_mem_ + static_cast<int64_t>(b) * mla_block_bytes_;
  const int64_t page_bytes = cfg_.page_tokens * geom_.mla_row(cfg_.kv_dtype).bytes();
  for (size_t m = 0; m < geom_.mla_layers.size(); ++m)
    s.mla[static_cast<size_t>(geom_.mla_layers[m])].pages.push_back(base + static_cast<int64_t>(m) * page_bytes);
  uint8_t* ibase = index_mem_ + static_cast<int64_t>(b) * index_block_bytes_;
  for (size_t m = 0; m < geom_.sparse_layers.size(); ++m)
    s.mla[static_cast<size_t>(geom_.sparse_layers[m])].indexer.pages.push_back(
        ibase + static_cast<int64_t>(m) * cfg_.page_tokens * geom_.index_row_bytes);
}

void CachePools::add_ref(int32_t b) {
  KCHECK(b >= 0 && b < num_blocks() && refs_[static_cast<size_t>(b)] > 0, "reference to a free MLA block");
  refs_[static_cast<size_t>(b)]++;
}

void CachePools::drop_ref(int32_t b) {
  KCHECK(b >= 0 && b < num_blocks() && refs_[static_cast<size_t>(b)] > 0, "double free of an MLA block");
  if (--refs_[static_cast<size_t>(b)] == 0) free_blocks_.push_back(b);
}

void CachePools::adopt_prefix(SequenceState& s, std::vector<int32_t>& blocks, std::span<const int32_t> shared) {
  KCHECK(blocks.empty() && s.n_tokens == 0, "a prefix is adopted by a fresh sequence only");
  for (int32_t b : shared) {
    add_ref(b);
    blocks.push_back(b);
    append_views(s, b);
  }
  const int64_t n = static_cast<int64_t>(shared.size()) * cfg_.page_tokens;
  for (int l : geom_.mla_layers) s.mla[static_cast<size_t>(l)].n_tokens = n;
  for (int l : geom_.sparse_layers) s.mla[static_cast<size_t>(l)].indexer.n_tokens = n;
  s.n_tokens = n;
}

void CachePools::mark_filled(SequenceState& s, std::span<const int32_t> blocks, int64_t n) {
  KCHECK(s.n_tokens == 0 && static_cast<int64_t>(blocks.size()) >= blocks_for(n), "mark_filled: pages do not cover the tokens");
  for (int l : geom_.mla_layers) s.mla[static_cast<size_t>(l)].n_tokens = n;
  for (int l : geom_.sparse_layers) s.mla[static_cast<size_t>(l)].indexer.n_tokens = n;
  s.n_tokens = n;
}

std::span<std::byte> CachePools::slot_arena() {
  return {reinterpret_cast<std::byte*>(slot_mem_), static_cast<size_t>(slot_bytes() * num_slots())};
}

std::span<std::byte> CachePools::mla_arena() {
  return {reinterpret_cast<std::byte*>(block_mem_), static_cast<size_t>(mla_block_bytes_ * num_blocks())};
}

std::span<std::byte> CachePools::index_arena() {
  if (index_block_bytes_ == 0) return {};
  return {reinterpret_cast<std::byte*>(index_mem_), static_cast<size_t>(index_block_bytes_ * num_blocks())};
}

void CachePools::read_block(int32_t b, uint8_t* dst) const {
  KCHECK(b >= 0 && b < num_blocks() && refs_[static_cast<size_t>(b)] > 0, "read of a free MLA block");
  std::memcpy(dst, block_mem_ + static_cast<int64_t>(b) * mla_block_bytes_, static_cast<size_t>(mla_block_bytes_));
  if (index_block_bytes_ > 0)
    std::memcpy(dst + mla_block_bytes_, index_mem_ + static_cast<int64_t>(b) * index_block_bytes_,
                static_cast<size_t>(index_block_bytes_));
}

void CachePools::write_block(int32_t b, const uint8_t* src) {
  KCHECK(b >= 0 && b < num_blocks() && refs_[static_cast<size_t>(b)] > 0, "write of a free MLA block");
  std::memcpy(block_mem_ + static_cast<int64_t>(b) * mla_block_bytes_, src, static_cast<size_t>(mla_block_bytes_));
  if (index_block_bytes_ > 0)
    std::memcpy(index_mem_ + static_cast<int64_t>(b) * index_block_bytes_, src + mla_block_bytes_,
                static_cast<size_t>(index_block_bytes_));
}

int32_t CachePools::alloc_block() {
  if (free_blocks_.empty()) return -1;
  const int32_t b = free_blocks_.back();
  free_blocks_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void CachePools::release(SequenceState& s, int slot, std::vector<int32_t>& blocks) {
  KCHECK(slot >= 0 && slot < num_slots() && slot_used_[static_cast<size_t>(slot)], "release of a free KDA slot");
  slot_used_[static_cast<size_t>(slot)] = false;
  free_slots_.push_back(slot);
  for (int32_t b : blocks) drop_ref(b);
  blocks.clear();
  for (auto& k : s.kda) k = KdaState{};
  for (auto& m : s.mla) m.pages.clear(), m.indexer.pages.clear();
  s.n_tokens = 0;
}

}  // namespace kestrel
