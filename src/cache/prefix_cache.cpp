#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace kestrel {

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(CachePools& pools, const PrefixCacheConfig& c,
                                                         std::string_view fingerprint, int64_t grid_blocks) {
  RadixCacheConfig rc;
  rc.block_tokens = pools.page_tokens();
  rc.needs_snapshot = pools.slot_floats() > 0;
  auto pc = std::unique_ptr<PrefixCache>(new PrefixCache(pools, c, rc));
  auto sp = SnapshotPool::create(pools.slot_floats(), rc.needs_snapshot ? c.snapshot_budget_bytes : 0);
  if (!sp) return sp.error();
  pc->snaps_ = std::move(*sp);
  pc->grid_blocks_ = std::max<int64_t>(1, grid_blocks);
  pc->model_ = model_digest(fingerprint);
  if (!c.disk_dir.empty()) {
    DiskStoreOptions o;
    o.dir = c.disk_dir;
    o.budget_bytes = c.disk_budget_bytes;
    auto d = DiskStore::open(std::move(o));
    if (!d) return d.error();
    pc->disk_ = std::move(*d);
    pc->writer_ = std::make_unique<TierWriter>(*pc->disk_, c.disk_writer);
    pc->st_.disk = true;
  }
  return pc;
}

PrefixCache::~PrefixCache() {
  // An orderly stop keeps what was computed: the queue is bounded, so this is bounded too.
  if (writer_) writer_->shutdown(TierWriter::Shutdown::kDrain);
}

PrefixCache::Lookup PrefixCache::attach(std::span<const Digest> keys, int64_t max_blocks, int64_t grid_blocks,
                                        SequenceState& s, std::vector<int32_t>& blocks, int slot) {
  const auto n = std::min<int64_t>(static_cast<int64_t>(keys.size()), std::max<int64_t>(0, max_blocks));
  st_.queries++;
  st_.query_tokens += n * block_tokens();
  const auto asked = keys.subspan(0, static_cast<size_t>(n));
  auto match = [&] {
    RadixCache::Match m = radix_.match(asked);
    if (!needs_snapshot() && grid_blocks > 1) {
      m.blocks = m.blocks / grid_blocks * grid_blocks;
      m.pages.resize(static_cast<size_t>(m.blocks));
    }
    return m;
  };
  RadixCache::Match m = match();
  Lookup r;
  r.page_tokens = m.page_blocks * block_tokens();
  int64_t from_disk = 0;
  if (disk_) {
    bool evicted = false;
    std::vector<int32_t> own;
    from_disk = restore(asked, m.blocks, grid_blocks, slot, evicted, m.pages, own);
    if (from_disk > 0) {
      // The restored blocks are the sequence's page table; the index holds those of the keys it lacked. The
      // snapshot is in the slot.
      m.blocks = from_disk;
      pools_.adopt_prefix(s, blocks, m.pages);
      for (int32_t b : own) pools_.drop_ref(b);  // the allocation's reference: the sequence holds its own now
      r.page_tokens = std::max(r.page_tokens, from_disk * block_tokens());
      r.tokens = m.blocks * block_tokens();
      st_.hit_tokens += r.tokens;
      return r;
    } else if (evicted) {
      m = match();  // making room may have dropped the live hit's blocks
    }
  }
  if (m.blocks == 0) return r;
  pools_.adopt_prefix(s, blocks, m.pages);
  if (needs_snapshot()) {
    KCHECK(m.snapshot >= 0, "a usable hit of a hybrid model carries a snapshot");
    std::memcpy(pools_.slot_data(slot), snaps_->data(m.snapshot), static_cast<size_t>(pools_.slot_floats()) * 4);
  }
  r.tokens = m.blocks * block_tokens();
  st_.hit_tokens += r.tokens;
  return r;
}

bool PrefixCache::load(const Digest& boundary, TierPayloadKind kind, TierObject& out) {
  const Digest name = tier_store_key(boundary, kind);
  auto got = disk_->get(name);
  if (!got) {
    st_.disk_read_errors++;
    return false;
  }
  if (!got->has_value()) {  // evicted since it was looked up
    st_.disk_incomplete++;
    return false;
  }
  auto obj = parse_tier_object(**got, boundary, model_, kind);
  // The shape must be this pool's: the pages of exactly the boundary's blocks, one slot of state.
  const bool shape_ok =
      obj && (kind == TierPayloadKind::kPages
                  ? obj->payload.size() == static_cast<size_t>(obj->blocks) * static_cast<size_t>(pools_.block_bytes())
                  : obj->payload.size() == static_cast<size_t>(pools_.slot_floats()) * 4);
  if (!shape_ok) {
    st_.disk_corrupt++;
    (void)disk_->erase(name);
    return false;
  }
  out = std::move(*obj);
  return true;
}

int64_t PrefixCache::restore(std::span<const Digest> keys, int64_t have, int64_t grid_blocks, int slot,
                             bool& evicted, std::vector<int32_t>& ids, std::vector<int32_t>& own) {
  const int64_t grid = std::max<int64_t>(1, grid_blocks);
  const int64_t top = static_cast<int64_t>(keys.size()) / grid * grid;
  if (top <= have) return 0;
  st_.disk_queries++;
  auto present = [&](const Digest& boundary, TierPayloadKind kind) {
    auto c = disk_->contains(tier_store_key(boundary, kind));
    if (!c) st_.disk_read_errors++;
    return c && *c;
  };
  TierObject pages, snap;
  int64_t g = 0;
  for (int64_t c = top; c > have && g == 0; c -= grid) {
    const Digest& at = keys[static_cast<size_t>(c - 1)];
    const bool has_pages = present(at, TierPayloadKind::kPages);
    const bool has_snap = !needs_snapshot() || present(at, TierPayloadKind::kSnapshot);
    if (!has_pages && (!has_snap || !needs_snapshot())) continue;
    if (!has_pages || !has_snap) {
      st_.disk_incomplete++;
      continue;
    }
    if (!load(at, TierPayloadKind::kPages, pages)) continue;
    if (pages.blocks != c) {
      st_.disk_corrupt++;
      continue;
    }
    if (needs_snapshot() && !load(at, TierPayloadKind::kSnapshot, snap)) continue;
    g = c;
  }
  if (g == 0) return 0;
  const auto path = keys.subspan(0, static_cast<size_t>(g));
  // Every block of the hit comes from the object, even where the index holds the key: a live page of a block that
  // an earlier request computed in a short last chunk need not equal the grid-chunk bits the object holds.
  if (pools_.free_blocks() < g) {
    evicted = true;
    if (!make_room(g)) {
      st_.disk_no_room++;
      return 0;
    }
  }
  const auto bb = static_cast<size_t>(pools_.block_bytes());
  ids.clear();
  for (size_t i = 0; i < static_cast<size_t>(g); ++i) {
    const int32_t b = pools_.alloc_block();
    KCHECK(b >= 0, "room was made for the restored blocks");
    pools_.write_block(b, pages.payload.data() + i * bb);
    ids.push_back(b);
  }
  // The index adopts the blocks of the keys it lacks and keeps the allocation's reference on them; the others are
  // the sequence's alone (the caller drops the allocation's reference once the sequence holds its own).
  adopted_.clear();
  if (!radix_.insert(path, ids, adopted_)) {
    for (int32_t b : ids) pools_.drop_ref(b);
    ids.clear();
    evicted = true;  // the caller looks again
    st_.disk_corrupt++;  // a key chain that does not connect: cannot happen with keys from one root
    return 0;
  }
  own.clear();
  for (int32_t b : ids)
    if (std::find(adopted_.begin(), adopted_.end(), b) == adopted_.end()) own.push_back(b);
  if (needs_snapshot()) {
    const size_t bytes = static_cast<size_t>(pools_.slot_floats()) * 4;
    std::memcpy(pools_.slot_data(slot), snap.payload.data(), bytes);
    if (auto id = hold()) {
      std::memcpy(snaps_->data(*id), snap.payload.data(), bytes);
      if (!radix_.attach_snapshot(path, *id)) snaps_->release(*id);
    }
  }
  st_.disk_hits++;
  st_.disk_hit_tokens += g * block_tokens();
  return g;
}

void PrefixCache::write_down(std::span<const Digest> keys, std::span<const int32_t> blocks, const float* state) {
  if (!writer_ || keys.empty()) return;
  const Digest& at = keys.back();
  const Digest pages_name = tier_store_key(at, TierPayloadKind::kPages);
  const Digest snap_name = tier_store_key(at, TierPayloadKind::kSnapshot);
  auto stored = [&](const Digest& name) {
    auto c = disk_->contains(name);
    return c && *c;
  };
  const bool want_snap = state != nullptr && needs_snapshot();
  const bool have_pages = stored(pages_name);
  if (have_pages && (!want_snap || stored(snap_name))) return;
  TierObject o;
  o.key = at;
  o.model = model_;
  if (!have_pages) {
    o.kind = TierPayloadKind::kPages;
    o.blocks = static_cast<uint32_t>(keys.size());
    const auto bb = static_cast<size_t>(pools_.block_bytes());
    o.payload.resize(keys.size() * bb);
    for (size_t i = 0; i < keys.size(); ++i) pools_.read_block(blocks[i], o.payload.data() + i * bb);
    // Pages first: a snapshot without its pages is useless, so it is queued only if they were.
    if (!writer_->submit(pages_name, serialize_tier_object(o))) return;
  }
  if (!want_snap) return;
  o.kind = TierPayloadKind::kSnapshot;
  o.blocks = 0;
  o.payload.resize(static_cast<size_t>(pools_.slot_floats()) * 4);
  std::memcpy(o.payload.data(), state, o.payload.size());
  writer_->submit(snap_name, serialize_tier_object(o));
}

void PrefixCache::write_down_pages(std::span<const Digest> keys, std::span<const int32_t> blocks) {
  if (!needs_snapshot()) write_down(keys, blocks, nullptr);
}

void PrefixCache::flush_tier() {
  if (writer_) writer_->flush();
}

void PrefixCache::tier_stats(PrefixCacheStats& s) const {
  if (!writer_) return;
  const TierWriterStats w = writer_->stats();
  const TierStoreStats d = disk_->stats();
  s.disk_submitted = w.submitted;
  s.disk_written = w.written;
  s.disk_write_errors = w.failed;
  s.disk_dropped = w.dropped_full + w.dropped_shutdown;
  s.disk_objects = d.objects;
  s.disk_bytes = d.bytes;
  s.disk_evictions = d.evictions;
}

void PrefixCache::store_pages(std::span<const Digest> keys, std::span<const int32_t> blocks) {
  KCHECK(blocks.size() >= keys.size(), "store_pages: fewer blocks than keys");
  adopted_.clear();
  if (!radix_.insert(keys, blocks.subspan(0, keys.size()), adopted_)) return;
  for (int32_t b : adopted_) pools_.add_ref(b);
}

bool PrefixCache::free_a_snapshot() {
  if (!radix_.evict_snapshot([this](int32_t id) { snaps_->release(id); })) return false;
  st_.evicted_snapshots++;
  return true;
}

std::optional<int32_t> PrefixCache::hold() {
  if (!needs_snapshot() || snaps_->capacity() == 0) return std::nullopt;
  if (snaps_->free_count() == 0 && !free_a_snapshot()) return std::nullopt;
  return snaps_->acquire();
}

void PrefixCache::commit(std::span<const Digest> keys, std::span<const int32_t> blocks, int32_t held) {
  store_pages(keys, blocks);
  if (cfg_.fault == SnapshotFault::kZero) std::fill_n(snaps_->data(held), pools_.slot_floats(), 0.0f);
  if (keys.empty() || !radix_.attach_snapshot(keys, held)) snaps_->release(held);
}

void PrefixCache::store_snapshot(std::span<const Digest> keys, std::span<const int32_t> blocks, const float* state) {
  store_pages(keys, blocks);
  if (!needs_snapshot() || keys.empty() || radix_.has_snapshot(keys) || !radix_.has_node(keys)) return;
  if (cfg_.fault == SnapshotFault::kNone) write_down(keys, blocks, state);
  auto id = hold();
  if (!id) return;
  std::memcpy(snaps_->data(*id), state, static_cast<size_t>(pools_.slot_floats()) * 4);
  commit(keys, blocks, *id);
}

bool PrefixCache::make_room(int64_t n_blocks) {
  const int64_t short_by = n_blocks - pools_.free_blocks();
  if (short_by <= 0) return true;
  // Only blocks held by the cache alone free memory when dropped.
  const int64_t dropped = radix_.evict_pages(
      short_by, [this](int32_t b) { return pools_.refs(b) == 1; }, [this](int32_t b) { pools_.drop_ref(b); },
      [this](int32_t id) {
        snaps_->release(id);
        st_.evicted_snapshots++;
      });
  st_.evicted_blocks += dropped;
  return pools_.free_blocks() >= n_blocks;
}

void PrefixCache::clear() {
  radix_.clear([this](int32_t b) { pools_.drop_ref(b); }, [this](int32_t id) { snaps_->release(id); });
  st_.flushes++;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = st_;
  s.cached_blocks = radix_.cached_blocks();
  s.snapshots = radix_.snapshots();
  s.snapshot_bytes = s.snapshots * snaps_->floats() * 4;
  s.snapshot_capacity = snaps_->capacity();
  tier_stats(s);
  return s;
}

}  // namespace kestrel
