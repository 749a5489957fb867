// The prefix cache's lower tiers (host memory L2, disk L3, Redis L4): finding and restoring a deeper boundary at
// admission, and writing boundaries down. See prefix_cache.h.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "base/check.h"
#include "cache/prefix_cache.h"

namespace kestrel {

bool PrefixCache::load(LowerTier& tier, const Digest& name, const Digest& key, TierPayloadKind kind, int64_t blocks,
                       TierObjectView& out, TierStore::Shared& raw) {
  bool failed = false;
  TierStore::Shared got = tier.get(name, failed);
  if (failed) return false;  // counted by the tier
  if (!got) {  // evicted since it was looked up
    tier.counters().incomplete++;
    return false;
  }
  // Verified in place: the payload is copied once, into the pools, by restore().
  auto obj = parse_tier_object_view(*got, key, model_, kind);
  // The shape must be this pool's: the pages of exactly the segment's blocks, one slot of state.
  const bool shape_ok =
      obj && (kind == TierPayloadKind::kPages
                  ? static_cast<int64_t>(obj->blocks) == blocks &&
                        obj->payload.size() == static_cast<size_t>(blocks) * static_cast<size_t>(pools_.block_bytes())
                  : obj->payload.size() == static_cast<size_t>(pools_.slot_floats()) * 4);
  if (!shape_ok) {
    tier.counters().corrupt++;
    tier.erase(name);
    return false;
  }
  out = *obj;
  raw = std::move(got);
  return true;
}

PrefixCache::Found PrefixCache::find(LowerTier& tier, std::span<const Digest> keys, int64_t have,
                                     int64_t grid_blocks) {
  const int64_t grid = std::max<int64_t>(1, grid_blocks);
  const int64_t top = static_cast<int64_t>(keys.size()) / grid * grid;
  if (top <= have || !tier.readable()) return Found{};
  TierCounters& n = tier.counters();
  n.queries++;
  const auto t0 = std::chrono::steady_clock::now();
  struct Timed {  // the admission's wait on this tier, however the lookup ends
    TierCounters& n;
    std::chrono::steady_clock::time_point t0;
    ~Timed() {
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      n.lookup_ns += ns;
      n.lookup_max_ns = std::max(n.lookup_max_ns, ns);
    }
  } timed{n, t0};
  const int64_t errors = n.read_errors;
  auto key_at = [&](int64_t blocks) -> const Digest& { return keys[static_cast<size_t>(blocks - 1)]; };
  // What the tier holds, asked once per object: a deeper boundary's segments are mostly a shallower one's. A
  // segment is keyed by its [first, end).
  struct Seg {
    int state = 0;  // 0 not asked, 1 absent, 2 present, 3 read and verified
    TierObjectView view;
    TierStore::Shared raw;
  };
  std::map<std::pair<int64_t, int64_t>, Seg> segs;
  auto seg_of = [&](const PageSegment& g) -> Seg& { return segs[{g.first, g.end}]; };
  auto present = [&](const Digest& name) {
    auto c = tier.contains(name);
    return c && *c;
  };
  // A store error ends the lookup in this tier: the next object would most likely wait out the same timeout.
  for (int64_t c = top; c > have && n.read_errors == errors; c -= grid) {
    const auto parts = page_segments(c, segment_blocks_);
    bool all = true;
    for (const PageSegment& g : parts) {
      Seg& e = seg_of(g);
      if (e.state == 0) e.state = present(tier_segment_key(key_at(g.end), g.first)) ? 2 : 1;
      if (n.read_errors != errors || e.state == 1) {
        all = false;
        break;
      }
    }
    Seg& last = seg_of(parts.back());  // the boundary's own object (unless shared with deeper ones)
    if (n.read_errors == errors && last.state == 0)
      last.state = present(tier_segment_key(key_at(c), parts.back().first)) ? 2 : 1;
    if (n.read_errors != errors) break;
    const bool has_snap = !needs_snapshot() || present(tier_store_key(key_at(c), TierPayloadKind::kSnapshot));
    if (n.read_errors != errors) break;
    // Whether anything of this boundary's own is here: its snapshot, or (pure MLA, or a short last segment no
    // deeper boundary shares) its last pages object. A hybrid boundary whose last segment is full may only have it
    // because a deeper boundary shares it: that is not a boundary written half.
    const bool own_pages = last.state >= 2 && (!needs_snapshot() || parts.back().blocks() < segment_blocks_);
    if (!own_pages && !(needs_snapshot() && has_snap)) continue;
    if (!all || !has_snap) {
      n.incomplete++;
      continue;
    }
    bool verified = true;
    for (const PageSegment& g : parts) {
      Seg& e = seg_of(g);
      if (e.state == 3) continue;
      if (!load(tier, tier_segment_key(key_at(g.end), g.first), key_at(g.end), TierPayloadKind::kPages, g.blocks(),
                e.view, e.raw)) {
        e.state = 1;
        verified = false;
        break;
      }
      e.state = 3;
    }
    if (!verified) continue;
    Found f;
    if (needs_snapshot() && !load(tier, tier_store_key(key_at(c), TierPayloadKind::kSnapshot), key_at(c),
                                  TierPayloadKind::kSnapshot, 0, f.snap, f.snap_raw))
      continue;
    for (const PageSegment& g : parts) {
      Seg& e = seg_of(g);
      f.pages.push_back(e.view);
      f.pages_raw.push_back(e.raw);
      f.pages_names.push_back(tier_segment_key(key_at(g.end), g.first));
    }
    f.blocks = c;
    return f;
  }
  return Found{};
}

int64_t PrefixCache::restore(std::span<const Digest> keys, int64_t have, int64_t grid_blocks, int slot,
                             bool& evicted, std::vector<int32_t>& ids, std::vector<int32_t>& own) {
  // Lookup order: host memory, the disk, then Redis, each asked only for boundaries deeper than the best found so
  // far.
  Found best;
  size_t from = 0;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    Found f = find(*tiers_[i], keys, std::max(have, best.blocks), grid_blocks);
    if (f.blocks > 0) best = std::move(f), from = i;
  }
  const int64_t g = best.blocks;
  if (g == 0) return 0;
  LowerTier& tier = *tiers_[from];
  const auto path = keys.subspan(0, static_cast<size_t>(g));
  // Every block of the hit comes from the objects, even where the index holds the key: a live page of a block that
  // an earlier request computed in a short last chunk need not equal the grid-chunk bits the objects hold.
  if (pools_.free_blocks() < g) {
    evicted = true;
    if (!make_room(g)) {
      tier.counters().no_room++;
      return 0;
    }
  }
  const auto bb = static_cast<size_t>(pools_.block_bytes());
  ids.clear();
  for (const TierObjectView& seg : best.pages) {
    for (size_t i = 0; i < seg.blocks; ++i) {
      const int32_t b = pools_.alloc_block();
      KCHECK(b >= 0, "room was made for the restored blocks");
      pools_.write_block(b, seg.payload.data() + i * bb);
      ids.push_back(b);
    }
  }
  KCHECK(static_cast<int64_t>(ids.size()) == g, "the segments of a boundary hold its blocks");
  // The index adopts the blocks of the keys it lacks and keeps the allocation's reference on them; the others are
  // the sequence's alone (the caller drops the allocation's reference once the sequence holds its own).
  adopted_.clear();
  if (!radix_.insert(path, ids, adopted_)) {
    for (int32_t b : ids) pools_.drop_ref(b);
    ids.clear();
    evicted = true;  // the caller looks again
    tier.counters().corrupt++;  // a key chain that does not connect: cannot happen with keys from one root
    return 0;
  }
  own.clear();
  for (int32_t b : ids)
    if (std::find(adopted_.begin(), adopted_.end(), b) == adopted_.end()) own.push_back(b);
  if (needs_snapshot()) {
    const size_t bytes = static_cast<size_t>(pools_.slot_floats()) * 4;
    std::memcpy(pools_.slot_data(slot), best.snap.payload.data(), bytes);
    if (auto id = hold()) {
      std::memcpy(snaps_->data(*id), best.snap.payload.data(), bytes);
      if (!radix_.attach_snapshot(path, *id)) snaps_->release(*id);
    }
  }
  tier.counters().hits++;
  tier.counters().hit_tokens += g * block_tokens();
  // A hit from a later tier (the disk, Redis) is written to the earlier ones (host memory, the disk): the verified
  // bytes as they were read, only the objects each lacks.
  const Digest snap_name = tier_store_key(keys[static_cast<size_t>(g - 1)], TierPayloadKind::kSnapshot);
  for (size_t i = 0; i < from; ++i) {
    LowerTier& up = *tiers_[i];
    bool pages = true;
    for (size_t k = 0; k < best.pages.size() && pages; ++k)
      pages = up.known(best.pages_names[k]) || up.submit(best.pages_names[k], *best.pages_raw[k]);
    if (pages && needs_snapshot() && !up.known(snap_name)) up.submit(snap_name, *best.snap_raw);
  }
  return g;
}

void PrefixCache::write_down(std::span<const Digest> keys, std::span<const int32_t> blocks, const float* state,
                             LowerTier* only) {
  if (tiers_.empty() || keys.empty()) return;
  const auto parts = page_segments(static_cast<int64_t>(keys.size()), segment_blocks_);
  auto end_key = [&](const PageSegment& g) -> const Digest& { return keys[static_cast<size_t>(g.end - 1)]; };
  const Digest snap_name = tier_store_key(keys.back(), TierPayloadKind::kSnapshot);
  const bool want_snap = state != nullptr && needs_snapshot();
  // Each object is serialised once, on first need, copied to each tier and handed over to the last.
  std::vector<std::vector<uint8_t>> seg_bytes(parts.size());
  std::vector<uint8_t> snap_bytes;
  LowerTier* const last = only != nullptr ? only : tiers_.back();
  auto give = [&](LowerTier* tier, std::vector<uint8_t>& bytes) { return tier == last ? std::move(bytes) : bytes; };
  TierObject o;
  o.model = model_;
  const auto bb = static_cast<size_t>(pools_.block_bytes());
  for (LowerTier* tier : tiers_) {
    if (only != nullptr && tier != only) continue;
    // Pages first, in block order: a snapshot without all of its pages is useless, so it is queued only if they
    // were (or are stored).
    bool pages = true;
    for (size_t k = 0; k < parts.size() && pages; ++k) {
      const PageSegment& g = parts[k];
      const Digest name = tier_segment_key(end_key(g), g.first);
      if (tier->known(name)) continue;
      if (seg_bytes[k].empty()) {
        o.key = end_key(g);
        o.kind = TierPayloadKind::kPages;
        o.blocks = static_cast<uint32_t>(g.blocks());
        o.payload.resize(static_cast<size_t>(g.blocks()) * bb);
        for (int64_t i = 0; i < g.blocks(); ++i)
          pools_.read_block(blocks[static_cast<size_t>(g.first + i)], o.payload.data() + static_cast<size_t>(i) * bb);
        seg_bytes[k] = serialize_tier_object(o);
      }
      pages = tier->submit(name, give(tier, seg_bytes[k]));
    }
    if (!pages || !want_snap || tier->known(snap_name)) continue;
    if (snap_bytes.empty()) {
      o.key = keys.back();
      o.kind = TierPayloadKind::kSnapshot;
      o.blocks = 0;
      o.payload.resize(static_cast<size_t>(pools_.slot_floats()) * 4);
      std::memcpy(o.payload.data(), state, o.payload.size());
      snap_bytes = serialize_tier_object(o);
    }
    tier->submit(snap_name, give(tier, snap_bytes));
  }
}

void PrefixCache::write_down_pages(std::span<const Digest> keys, std::span<const int32_t> blocks) {
  if (!needs_snapshot()) write_down(keys, blocks, nullptr);
}

void PrefixCache::flush_tier() {
  for (LowerTier* t : tiers_) t->flush();
}

void PrefixCache::tier_stats(PrefixCacheStats& s) const {
  if (host_) host_->fill(s.host);
  if (disk_) disk_->fill(s.disk);
  if (redis_) redis_->fill(s.redis);
}

}  // namespace kestrel
