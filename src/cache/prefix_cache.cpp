#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "cache/redis_store.h"

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
  if (c.tier_object_bytes <= 0) return invalid_argument("prefix cache: tier_object_bytes must be positive");
  pc->segment_blocks_ = segment_blocks_for(pools.block_bytes(), c.tier_object_bytes);
  pc->model_ = model_digest(fingerprint);
  if (c.host_store || c.host_budget_bytes > 0) {
    pc->host_store_ = c.host_store;
    if (!pc->host_store_) {
      auto h = HostStore::create(HostStoreOptions{c.host_budget_bytes});
      if (!h) return h.error();
      pc->host_store_ = std::move(*h);
    }
    LowerTierOptions lo;
    lo.synchronous = true;
    pc->host_ = std::make_unique<LowerTier>(pc->host_store_, lo);
    pc->tiers_.push_back(pc->host_.get());
  }
  if (!c.disk_dir.empty()) {
    DiskStoreOptions o;
    o.dir = c.disk_dir;
    o.budget_bytes = c.disk_budget_bytes;
    auto d = DiskStore::open(std::move(o));
    if (!d) return d.error();
    LowerTierOptions lo;
    lo.writer = c.disk_writer;
    pc->disk_ = std::make_unique<LowerTier>(std::move(*d), lo);
    pc->tiers_.push_back(pc->disk_.get());
  }
  if (!c.redis_host.empty()) {
    RedisStoreOptions o;
    o.host = c.redis_host;
    o.port = c.redis_port;
    o.key_prefix = c.redis_key_prefix;
    o.connect_timeout_ms = c.redis_timeout_ms;
    o.command_timeout_ms = c.redis_timeout_ms;
    auto r = RedisStore::create(std::move(o));  // does not connect: a server that is down is an error per call
    if (!r) return r.error();
    LowerTierOptions lo;
    lo.writer = c.redis_writer;
    lo.remote = true;
    lo.read_backoff = c.redis_backoff;
    pc->redis_ = std::make_unique<LowerTier>(std::move(*r), lo);
    pc->tiers_.push_back(pc->redis_.get());
  }
  return pc;
}

// The tiers drain their writers: an orderly stop keeps what was computed (the queues are bounded, so this is too).
PrefixCache::~PrefixCache() = default;

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
  int64_t from_tier = 0;
  if (!tiers_.empty()) {
    bool evicted = false;
    std::vector<int32_t> own;
    from_tier = restore(asked, m.blocks, grid_blocks, slot, evicted, m.pages, own);
    if (from_tier > 0) {
      // The restored blocks are the sequence's page table; the index holds those of the keys it lacked. The
      // snapshot is in the slot.
      m.blocks = from_tier;
      pools_.adopt_prefix(s, blocks, m.pages);
      for (int32_t b : own) pools_.drop_ref(b);  // the allocation's reference: the sequence holds its own now
      r.page_tokens = std::max(r.page_tokens, from_tier * block_tokens());
      r.tokens = m.blocks * block_tokens();
      st_.hit_tokens += r.tokens;
      return r;
    } else if (evicted) {
      m = match();  // making room may have dropped the live hit's blocks
    }
  }
  if (m.blocks == 0) return r;
  pools_.adopt_prefix(s, blocks, m.pages);
  if (host_) {
    // A live hit is a use of its boundary: host memory's LRU order follows it. A pure-MLA model's hit may end at a
    // branch point inside a stored prefix, which has no object yet: it is written on this, its second sighting (a
    // hybrid model snapshots such a point, and the snapshot is written). The pages are the index's, which hold a
    // cold prefill's bits (whole-chunk rule), so host memory never holds what the live pools could not serve.
    const auto hit = asked.subspan(0, static_cast<size_t>(m.blocks));
    if (!needs_snapshot()) write_down(hit, m.pages, nullptr, host_.get());  // only the segments it lacks
    for (const PageSegment& g : page_segments(m.blocks, segment_blocks_))
      host_store_->touch(tier_segment_key(hit[static_cast<size_t>(g.end - 1)], g.first));
    if (needs_snapshot()) host_store_->touch(tier_store_key(hit.back(), TierPayloadKind::kSnapshot));
  }
  if (needs_snapshot()) {
    KCHECK(m.snapshot >= 0, "a usable hit of a hybrid model carries a snapshot");
    std::memcpy(pools_.slot_data(slot), snaps_->data(m.snapshot), static_cast<size_t>(pools_.slot_floats()) * 4);
  }
  r.tokens = m.blocks * block_tokens();
  st_.hit_tokens += r.tokens;
  return r;
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
  if (host_) s.host = host_->counters();  // the lookups' counts; the writer's and the store's below
  if (disk_) s.disk = disk_->counters();
  if (redis_) s.redis = redis_->counters();
  tier_stats(s);
  return s;
}

}  // namespace kestrel
