// The prefix cache's lower tiers (host memory L2, disk L3, Redis L4): finding and restoring a deeper boundary at
// admission, and writing boundaries down. See prefix_cache.h.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/check.h"
#include "cache/prefix_cache.h"

namespace kestrel {

bool PrefixCache::load(LowerTier& tier, const Digest& boundary, TierPayloadKind kind, TierObjectView& out,
                       TierStore::Shared& raw) {
  const Digest name = tier_store_key(boundary, kind);
  bool failed = false;
  TierStore::Shared got = tier.get(name, failed);
  if (failed) return false;  // counted by the tier
  if (!got) {  // evicted since it was looked up
    tier.counters().incomplete++;
    return false;
  }
  // Verified in place: the payload is copied once, into the pools, by restore().
  auto obj = parse_tier_object_view(*got, boundary, model_, kind);
  // The shape must be this pool's: the pages of exactly the boundary's blocks, one slot of state.
  const bool shape_ok =
      obj && (kind == TierPayloadKind::kPages
                  ? obj->payload.size() == static_cast<size_t>(obj->blocks) * static_cast<size_t>(pools_.block_bytes())
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
  Found f;
  const int64_t grid = std::max<int64_t>(1, grid_blocks);
  const int64_t top = static_cast<int64_t>(keys.size()) / grid * grid;
  if (top <= have || !tier.readable()) return f;
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
  // A store error ends the lookup in this tier: the next boundary would most likely wait out the same timeout.
  auto present = [&](const Digest& boundary, TierPayloadKind kind) {
    auto c = tier.contains(tier_store_key(boundary, kind));
    return c && *c;
  };
  for (int64_t c = top; c > have && n.read_errors == errors; c -= grid) {
    const Digest& at = keys[static_cast<size_t>(c - 1)];
    const bool has_pages = present(at, TierPayloadKind::kPages);
    if (n.read_errors != errors) break;
    const bool has_snap = !needs_snapshot() || present(at, TierPayloadKind::kSnapshot);
    if (n.read_errors != errors) break;
    if (!has_pages && (!has_snap || !needs_snapshot())) continue;
    if (!has_pages || !has_snap) {
      n.incomplete++;
      continue;
    }
    if (!load(tier, at, TierPayloadKind::kPages, f.pages, f.pages_raw)) continue;
    if (f.pages.blocks != c) {
      n.corrupt++;
      continue;
    }
    if (needs_snapshot() && !load(tier, at, TierPayloadKind::kSnapshot, f.snap, f.snap_raw)) continue;
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
  // Every block of the hit comes from the object, even where the index holds the key: a live page of a block that
  // an earlier request computed in a short last chunk need not equal the grid-chunk bits the object holds.
  if (pools_.free_blocks() < g) {
    evicted = true;
    if (!make_room(g)) {
      tier.counters().no_room++;
      return 0;
    }
  }
  const auto bb = static_cast<size_t>(pools_.block_bytes());
  ids.clear();
  for (size_t i = 0; i < static_cast<size_t>(g); ++i) {
    const int32_t b = pools_.alloc_block();
    KCHECK(b >= 0, "room was made for the restored blocks");
    pools_.write_block(b, best.pages.payload.data() + i * bb);
    ids.push_back(b);
  }
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
  // bytes as they were read.
  const Digest& at = keys[static_cast<size_t>(g - 1)];
  for (size_t i = 0; i < from; ++i) {
    LowerTier& up = *tiers_[i];
    const Digest pages_name = tier_store_key(at, TierPayloadKind::kPages);
    if (!up.known(pages_name) && !up.submit(pages_name, *best.pages_raw)) continue;
    const Digest snap_name = tier_store_key(at, TierPayloadKind::kSnapshot);
    if (needs_snapshot() && !up.known(snap_name)) up.submit(snap_name, *best.snap_raw);
  }
  return g;
}

void PrefixCache::write_down(std::span<const Digest> keys, std::span<const int32_t> blocks, const float* state,
                             LowerTier* only) {
  if (tiers_.empty() || keys.empty()) return;
  const Digest& at = keys.back();
  const Digest pages_name = tier_store_key(at, TierPayloadKind::kPages);
  const Digest snap_name = tier_store_key(at, TierPayloadKind::kSnapshot);
  const bool want_snap = state != nullptr && needs_snapshot();
  // Each object is serialised once, on first need, copied to each tier and handed over to the last.
  std::vector<uint8_t> pages_bytes, snap_bytes;
  LowerTier* const last = only != nullptr ? only : tiers_.back();
  auto give = [&](LowerTier* tier, std::vector<uint8_t>& bytes) { return tier == last ? std::move(bytes) : bytes; };
  TierObject o;
  o.key = at;
  o.model = model_;
  for (LowerTier* tier : tiers_) {
    if (only != nullptr && tier != only) continue;
    const bool have_pages = tier->known(pages_name);
    if (have_pages && (!want_snap || tier->known(snap_name))) continue;
    if (!have_pages) {
      if (pages_bytes.empty()) {
        o.kind = TierPayloadKind::kPages;
        o.blocks = static_cast<uint32_t>(keys.size());
        const auto bb = static_cast<size_t>(pools_.block_bytes());
        o.payload.resize(keys.size() * bb);
        for (size_t i = 0; i < keys.size(); ++i) pools_.read_block(blocks[i], o.payload.data() + i * bb);
        pages_bytes = serialize_tier_object(o);
      }
      // Pages first: a snapshot without its pages is useless, so it is queued only if they were.
      if (!tier->submit(pages_name, give(tier, pages_bytes))) continue;
    }
    if (!want_snap) continue;
    if (snap_bytes.empty()) {
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
