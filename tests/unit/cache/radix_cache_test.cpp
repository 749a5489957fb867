// RadixCache: the prefix-cache index (cache/radix_cache.h), without a model.
#include "cache/radix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace kestrel {
namespace {

constexpr int64_t kBt = 4;  // tokens per block in these tests

// Keys of a sequence whose block b is {v[b], v[b], v[b], v[b]} (one value per block keeps the tests readable).
std::vector<Digest> keys_of(const std::vector<int32_t>& blocks, std::string_view salt = "") {
  std::vector<int32_t> tokens;
  for (int32_t v : blocks) tokens.insert(tokens.end(), kBt, v);
  std::vector<Digest> out;
  extend_block_keys(chain_root("test-model", salt), tokens, kBt, out);
  return out;
}

std::vector<Digest> first(const std::vector<Digest>& k, size_t n) { return {k.begin(), k.begin() + n}; }

// Collects every callback of an eviction or clear, in order.
struct Drops {
  std::vector<int32_t> pages, snaps;
  std::function<void(int32_t)> page() {
    return [this](int32_t p) { pages.push_back(p); };
  }
  std::function<void(int32_t)> snap() {
    return [this](int32_t s) { snaps.push_back(s); };
  }
};
const auto kAll = [](int32_t) { return true; };

RadixCacheConfig pages_only() {
  RadixCacheConfig c;
  c.block_tokens = kBt;
  c.needs_snapshot = false;
  return c;
}
RadixCacheConfig hybrid() {
  RadixCacheConfig c;
  c.block_tokens = kBt;
  return c;
}

TEST(RadixCache, InsertAndPartialMatch) {
  RadixCache rc(pages_only());
  const auto a = keys_of({1, 2, 3});
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{10, 11, 12}, adopted));
  EXPECT_EQ(adopted, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(rc.cached_blocks(), 3);
  auto m = rc.match(a);
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.page_blocks, 3);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(m.snapshot, -1);
  // Longer sequence with the same first 3 blocks: the 3 cached blocks.
  m = rc.match(keys_of({1, 2, 3, 4, 5}));
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{10, 11, 12}));
  // Diverges at block 1: only block 0.
  m = rc.match(keys_of({1, 9, 3}));
  EXPECT_EQ(m.blocks, 1);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{10}));
  // Same block values later in a different prefix do not match (the key chains the prefix).
  m = rc.match(keys_of({2, 3}));
  EXPECT_EQ(m.blocks, 0);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_EQ(rc.match({}).blocks, 0);
  EXPECT_TRUE(rc.has_node(first(a, 2)));
  EXPECT_FALSE(rc.has_node(keys_of({1, 2, 3, 4})));
  EXPECT_FALSE(rc.has_node({}));
}

TEST(RadixCache, HitStopsAtDeepestSnapshot) {
  RadixCache rc(hybrid());
  const auto a = keys_of({1, 2, 3, 4});
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{20, 21, 22, 23}, adopted));
  // Pages but no state anywhere: no usable hit, four tombstone blocks.
  auto m = rc.match(a);
  EXPECT_EQ(m.blocks, 0);
  EXPECT_EQ(m.page_blocks, 4);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_EQ(m.snapshot, -1);
  ASSERT_TRUE(rc.attach_snapshot(first(a, 2), 7));
  m = rc.match(a);
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.page_blocks, 4);  // blocks 2, 3: pages without state beyond the hit
  EXPECT_EQ(m.pages, (std::vector<int32_t>{20, 21}));
  EXPECT_EQ(m.snapshot, 7);
  // A 3-block query: still the snapshot at block 2.
  m = rc.match(first(a, 3));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.page_blocks, 3);
  ASSERT_TRUE(rc.attach_snapshot(a, 8));
  m = rc.match(keys_of({1, 2, 3, 4, 5}));
  EXPECT_EQ(m.blocks, 4);
  EXPECT_EQ(m.snapshot, 8);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{20, 21, 22, 23}));
  // A query that ends inside the cached run before any snapshot: no hit.
  m = rc.match(first(a, 1));
  EXPECT_EQ(m.blocks, 0);
  EXPECT_EQ(m.page_blocks, 1);
}

TEST(RadixCache, PagesOnlyIgnoresSnapshots) {
  RadixCache rc(pages_only());
  const auto a = keys_of({1, 2, 3});
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{1, 2, 3}, adopted));
  ASSERT_TRUE(rc.attach_snapshot(first(a, 1), 5));
  const auto m = rc.match(a);
  EXPECT_EQ(m.blocks, 3);  // the deepest page run, not the snapshot
  EXPECT_EQ(m.snapshot, -1);
}

TEST(RadixCache, InsertAdoptsOnlyNewBlocks) {
  RadixCache rc(pages_only());
  const auto a = keys_of({1, 2, 3, 4});
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{0, 1, 2, 3}, adopted));
  EXPECT_EQ(adopted.size(), 4u);
  adopted.clear();
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{100, 101, 102, 103}, adopted));
  EXPECT_TRUE(adopted.empty());
  EXPECT_EQ(rc.match(a).pages, (std::vector<int32_t>{0, 1, 2, 3}));  // the cache keeps its pages
  // A branch sharing 2 blocks adopts only its own 3.
  const auto b = keys_of({1, 2, 7, 8, 9});
  ASSERT_TRUE(rc.insert(b, std::vector<int32_t>{200, 201, 202, 203, 204}, adopted));
  EXPECT_EQ(adopted, (std::vector<int32_t>{202, 203, 204}));
  EXPECT_EQ(rc.cached_blocks(), 7);
  EXPECT_EQ(rc.match(b).pages, (std::vector<int32_t>{0, 1, 202, 203, 204}));
  // Growing A adopts only the new tail.
  adopted.clear();
  ASSERT_TRUE(rc.insert(keys_of({1, 2, 3, 4, 5, 6}), std::vector<int32_t>{9, 9, 9, 9, 300, 301}, adopted));
  EXPECT_EQ(adopted, (std::vector<int32_t>{300, 301}));
  EXPECT_EQ(rc.cached_blocks(), 9);
}

TEST(RadixCache, InsertRejectsChainThatDoesNotConnect) {
  RadixCache rc(pages_only());
  const auto a = keys_of({1, 2, 3});
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{0, 1, 2}, adopted));
  adopted.clear();
  // Starts at block 1: its key is cached under block 0, not at the root.
  EXPECT_FALSE(rc.insert(std::vector<Digest>(a.begin() + 1, a.end()), std::vector<int32_t>{5, 6}, adopted));
  // A cached key after a missing one.
  const auto other = keys_of({9});
  std::vector<Digest> bad = {other[0], a[1]};
  EXPECT_FALSE(rc.insert(bad, std::vector<int32_t>{5, 6}, adopted));
  EXPECT_TRUE(adopted.empty());
  EXPECT_EQ(rc.cached_blocks(), 3);
  EXPECT_FALSE(rc.has_node(std::vector<Digest>{other[0]}));
}

TEST(RadixCache, AttachSnapshotRules) {
  RadixCache rc(hybrid());
  const auto a = keys_of({1, 2, 3});
  EXPECT_FALSE(rc.attach_snapshot(a, 1));  // nothing cached
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(first(a, 2), std::vector<int32_t>{0, 1}, adopted));
  EXPECT_FALSE(rc.attach_snapshot(a, 1));  // block 2 not cached
  EXPECT_FALSE(rc.attach_snapshot({}, 1));
  EXPECT_FALSE(rc.has_snapshot(first(a, 2)));
  EXPECT_TRUE(rc.attach_snapshot(first(a, 2), 1));
  EXPECT_FALSE(rc.attach_snapshot(first(a, 2), 2));  // already has one: the caller keeps snapshot 2
  EXPECT_TRUE(rc.has_snapshot(first(a, 2)));
  EXPECT_FALSE(rc.has_snapshot(first(a, 1)));
  EXPECT_EQ(rc.snapshots(), 1);
  EXPECT_EQ(rc.match(a).snapshot, 1);  // the first one stayed
  EXPECT_TRUE(rc.attach_snapshot(first(a, 1), 3));
  EXPECT_EQ(rc.snapshots(), 2);
}

TEST(RadixCache, EvictionRespectsEvictableAndNeverRemovesAParent) {
  RadixCache rc(pages_only());
  std::vector<int32_t> adopted;
  const auto a = keys_of({1, 2, 3, 4}), b = keys_of({1, 2, 7, 8});
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{0, 1, 2, 3}, adopted));
  ASSERT_TRUE(rc.insert(b, std::vector<int32_t>{0, 1, 12, 13}, adopted));
  ASSERT_EQ(rc.cached_blocks(), 6);
  // Page 3 (A's leaf) is in use: A's branch and the shared blocks 0, 1 must stay.
  Drops d;
  EXPECT_EQ(rc.evict_pages(100, [](int32_t p) { return p != 3; }, d.page(), d.snap()), 2);
  EXPECT_EQ(d.pages, (std::vector<int32_t>{13, 12}));  // leaf first, then its parent once it is a leaf
  EXPECT_EQ(rc.cached_blocks(), 4);
  EXPECT_EQ(rc.match(a).blocks, 4);
  EXPECT_EQ(rc.match(b).blocks, 2);
  // Nothing else evictable while page 3 is pinned: its ancestors have a child.
  EXPECT_EQ(rc.evict_pages(100, [](int32_t p) { return p != 3; }, d.page(), d.snap()), 0);
  // Unpinned: leaves go before their parents, and `n` bounds the count.
  d.pages.clear();
  EXPECT_EQ(rc.evict_pages(3, kAll, d.page(), d.snap()), 3);
  EXPECT_EQ(d.pages, (std::vector<int32_t>{3, 2, 1}));
  EXPECT_EQ(rc.match(a).blocks, 1);
  EXPECT_EQ(rc.evict_pages(3, kAll, d.page(), d.snap()), 1);
  EXPECT_EQ(rc.cached_blocks(), 0);
  EXPECT_TRUE(d.snaps.empty());
}

TEST(RadixCache, EvictingANodeDropsItsSnapshot) {
  RadixCache rc(hybrid());
  std::vector<int32_t> adopted;
  const auto a = keys_of({1, 2});
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{0, 1}, adopted));
  ASSERT_TRUE(rc.attach_snapshot(a, 40));
  ASSERT_TRUE(rc.attach_snapshot(first(a, 1), 41));
  Drops d;
  EXPECT_EQ(rc.evict_pages(1, kAll, d.page(), d.snap()), 1);
  EXPECT_EQ(d.pages, std::vector<int32_t>{1});
  EXPECT_EQ(d.snaps, std::vector<int32_t>{40});
  EXPECT_EQ(rc.snapshots(), 1);
  EXPECT_FALSE(rc.has_node(a));
  const auto m = rc.match(a);
  EXPECT_EQ(m.blocks, 1);
  EXPECT_EQ(m.snapshot, 41);
}

TEST(RadixCache, EvictSnapshotKeepsPages) {
  RadixCache rc(hybrid());
  std::vector<int32_t> adopted;
  const auto a = keys_of({1, 2, 3});
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{0, 1, 2}, adopted));
  Drops d;
  EXPECT_FALSE(rc.evict_snapshot(d.snap()));
  ASSERT_TRUE(rc.attach_snapshot(a, 5));
  ASSERT_TRUE(rc.evict_snapshot(d.snap()));
  EXPECT_EQ(d.snaps, std::vector<int32_t>{5});
  EXPECT_EQ(rc.snapshots(), 0);
  EXPECT_EQ(rc.cached_blocks(), 3);
  const auto m = rc.match(a);
  EXPECT_EQ(m.blocks, 0);
  EXPECT_EQ(m.page_blocks, 3);
  EXPECT_FALSE(rc.evict_snapshot(d.snap()));
  EXPECT_TRUE(rc.attach_snapshot(a, 6));  // the node can take a new one
}

// Pages: older first; at (nearly) equal age the shallower leaf goes first, because a deeper block saves more
// compute (score = tick + w * log2(1 + depth)).
TEST(RadixCache, PagePriorityOrder) {
  std::vector<int32_t> adopted;
  {
    // Pure LRU (w = 0): the least recently used leaf goes first; a match refreshes.
    RadixCacheConfig c = pages_only();
    c.depth_weight = 0;
    RadixCache rc(c);
    ASSERT_TRUE(rc.insert(keys_of({1}), std::vector<int32_t>{1}, adopted));
    ASSERT_TRUE(rc.insert(keys_of({2}), std::vector<int32_t>{2}, adopted));
    ASSERT_TRUE(rc.insert(keys_of({3}), std::vector<int32_t>{3}, adopted));
    rc.match(keys_of({1}));
    Drops d;
    EXPECT_EQ(rc.evict_pages(3, kAll, d.page(), d.snap()), 3);
    EXPECT_EQ(d.pages, (std::vector<int32_t>{2, 3, 1}));
  }
  {
    // A deep leaf one tick older than a shallow leaf: with w = 0 it goes first (older), with the default w the
    // shallow one goes first.
    for (double w : {0.0, 16.0}) {
      RadixCacheConfig c = pages_only();
      c.depth_weight = w;
      RadixCache rc(c);
      ASSERT_TRUE(rc.insert(keys_of({5, 6, 7, 8}), std::vector<int32_t>{50, 60, 70, 80}, adopted));  // depth 4
      ASSERT_TRUE(rc.insert(keys_of({9}), std::vector<int32_t>{90}, adopted));                       // depth 1
      Drops d;
      EXPECT_EQ(rc.evict_pages(1, kAll, d.page(), d.snap()), 1);
      EXPECT_EQ(d.pages, std::vector<int32_t>{w == 0 ? 80 : 90}) << "w=" << w;
    }
  }
  {
    // Age beats depth once the age gap exceeds the bonus: depth 4 (bonus 16*log2(5) = 37.2) vs depth 1 (bonus 16)
    // with the deep leaf 30 ticks older goes first.
    RadixCache rc(pages_only());
    ASSERT_TRUE(rc.insert(keys_of({5, 6, 7, 8}), std::vector<int32_t>{50, 60, 70, 80}, adopted));
    ASSERT_TRUE(rc.insert(keys_of({9}), std::vector<int32_t>{90}, adopted));
    for (int i = 0; i < 30; ++i) rc.match(keys_of({9}));
    Drops d;
    EXPECT_EQ(rc.evict_pages(1, kAll, d.page(), d.snap()), 1);
    EXPECT_EQ(d.pages, std::vector<int32_t>{80});
  }
  {
    // Hybrid: a tombstone leaf (no snapshot: no hit can end there) loses the depth bonus, so it goes before an
    // equally deep, older leaf that has a snapshot.
    RadixCache rc(hybrid());
    const auto a = keys_of({1, 2, 3, 4}), b = keys_of({5, 6, 7, 8});
    ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{10, 11, 12, 13}, adopted));
    ASSERT_TRUE(rc.attach_snapshot(a, 1));
    ASSERT_TRUE(rc.insert(b, std::vector<int32_t>{20, 21, 22, 23}, adopted));
    Drops d;
    EXPECT_EQ(rc.evict_pages(1, kAll, d.page(), d.snap()), 1);
    EXPECT_EQ(d.pages, std::vector<int32_t>{23});
    EXPECT_TRUE(d.snaps.empty());
    EXPECT_TRUE(rc.has_snapshot(a));
  }
}

TEST(RadixCache, SnapshotPriorityOrder) {
  RadixCache rc(hybrid());
  std::vector<int32_t> adopted;
  const auto a = keys_of({1, 2, 3, 4, 5, 6, 7, 8});
  ASSERT_TRUE(rc.insert(a, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}, adopted));
  ASSERT_TRUE(rc.attach_snapshot(a, 108));             // depth 8, oldest
  ASSERT_TRUE(rc.attach_snapshot(first(a, 1), 101));   // depth 1, one tick newer: shallow goes first
  ASSERT_TRUE(rc.attach_snapshot(first(a, 4), 104));   // depth 4
  for (int i = 0; i < 100; ++i) rc.match(first(a, 4));  // refreshes only the consumed snapshot (104)
  Drops d;
  ASSERT_TRUE(rc.evict_snapshot(d.snap()));
  ASSERT_TRUE(rc.evict_snapshot(d.snap()));
  ASSERT_TRUE(rc.evict_snapshot(d.snap()));
  EXPECT_EQ(d.snaps, (std::vector<int32_t>{101, 108, 104}));
  EXPECT_EQ(rc.cached_blocks(), 8);
}

TEST(RadixCache, ClearDropsEverythingOnce) {
  RadixCache rc(hybrid());
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(keys_of({1, 2, 3}), std::vector<int32_t>{0, 1, 2}, adopted));
  ASSERT_TRUE(rc.insert(keys_of({1, 5}), std::vector<int32_t>{0, 3}, adopted));
  ASSERT_TRUE(rc.attach_snapshot(keys_of({1, 2}), 9));
  ASSERT_TRUE(rc.attach_snapshot(keys_of({1, 5}), 8));
  Drops d;
  rc.clear(d.page(), d.snap());
  std::sort(d.pages.begin(), d.pages.end());
  std::sort(d.snaps.begin(), d.snaps.end());
  EXPECT_EQ(d.pages, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(d.snaps, (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(rc.cached_blocks(), 0);
  EXPECT_EQ(rc.snapshots(), 0);
  EXPECT_EQ(rc.match(keys_of({1, 2, 3})).page_blocks, 0);
  EXPECT_FALSE(rc.evict_snapshot(d.snap()));
  EXPECT_EQ(rc.evict_pages(10, kAll, d.page(), d.snap()), 0);
  adopted.clear();
  ASSERT_TRUE(rc.insert(keys_of({1}), std::vector<int32_t>{7}, adopted));
  EXPECT_EQ(adopted, std::vector<int32_t>{7});
}

TEST(RadixCache, SaltAndFingerprintSeparateTenants) {
  RadixCache rc(pages_only());
  std::vector<int32_t> adopted;
  ASSERT_TRUE(rc.insert(keys_of({1, 2, 3}, "tenant-a"), std::vector<int32_t>{0, 1, 2}, adopted));
  EXPECT_EQ(rc.match(keys_of({1, 2, 3}, "tenant-a")).blocks, 3);
  EXPECT_EQ(rc.match(keys_of({1, 2, 3}, "tenant-b")).page_blocks, 0);
  EXPECT_EQ(rc.match(keys_of({1, 2, 3})).page_blocks, 0);
  std::vector<int32_t> tokens(3 * kBt, 1);
  std::vector<Digest> other_model;
  extend_block_keys(chain_root("other-model", "tenant-a"), tokens, kBt, other_model);
  EXPECT_EQ(rc.match(other_model).page_blocks, 0);
  // The second tenant gets its own copy.
  adopted.clear();
  ASSERT_TRUE(rc.insert(keys_of({1, 2, 3}, "tenant-b"), std::vector<int32_t>{5, 6, 7}, adopted));
  EXPECT_EQ(adopted.size(), 3u);
}

// 150k cached blocks evicted one page per call: a linear scan per eviction would take minutes.
TEST(RadixCache, LargeTreeEvictionIsFast) {
  RadixCache rc(pages_only());
  const Digest root = chain_root("big", "");
  std::vector<int32_t> adopted;
  int32_t next_page = 0;
  std::vector<Digest> shared;
  std::vector<int32_t> shared_tokens(10 * kBt, 7);
  extend_block_keys(root, shared_tokens, kBt, shared);
  for (int s = 0; s < 1500; ++s) {
    std::vector<int32_t> tokens = shared_tokens;
    for (int b = 0; b < 100; ++b) tokens.insert(tokens.end(), kBt, s * 1000 + b);
    std::vector<Digest> keys;
    extend_block_keys(root, tokens, kBt, keys);
    std::vector<int32_t> pages(keys.size());
    for (auto& p : pages) p = next_page++;
    ASSERT_TRUE(rc.insert(keys, pages, adopted));
  }
  ASSERT_EQ(rc.cached_blocks(), 150010);
  // Pin 100 leaves: every call must skip them without scanning the rest.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<char> pinned(static_cast<size_t>(next_page), 0);
  for (int s = 0; s < 100; ++s) pinned[static_cast<size_t>(s * 110 + 109)] = 1;  // the leaf page of sequence s
  std::vector<char> dropped(static_cast<size_t>(next_page), 0);
  int64_t total = 0;
  for (;;) {
    const int64_t n = rc.evict_pages(1, [&](int32_t p) { return !pinned[static_cast<size_t>(p)]; },
                                     [&](int32_t p) {
                                       ASSERT_FALSE(dropped[static_cast<size_t>(p)]);
                                       dropped[static_cast<size_t>(p)] = 1;
                                     },
                                     [](int32_t) {});
    if (n == 0) break;
    total += n;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // What remains: the 100 pinned branches (each 100 blocks) over the shared 10.
  EXPECT_EQ(rc.cached_blocks(), 100 * 100 + 10);
  EXPECT_EQ(total, 150010 - rc.cached_blocks());
  EXPECT_LT(secs, 10.0);
  for (int s = 0; s < 100; ++s) EXPECT_FALSE(dropped[static_cast<size_t>(s * 110 + 109)]);
  // Unpinned, they go too.
  EXPECT_EQ(rc.evict_pages(1 << 30, kAll, [](int32_t) {}, [](int32_t) {}), 100 * 100 + 10);
  EXPECT_EQ(rc.cached_blocks(), 0);
}

// ---- Randomised test against a brute-force model ----------------------------------------------------------------
//
// The model keys nodes by the token prefix itself (no hashing) and recomputes every answer by scanning: the usable
// hit, which nodes are leaves, and the eviction score (tick + w * log2(1 + depth), no bonus for a tombstone leaf on
// a hybrid model). Every match must agree, every dropped page must be a minimum-score evictable leaf at the moment it
// is dropped, every dropped snapshot a minimum-score snapshot, and no id may be dropped twice or leaked.

struct ModelNode {
  int32_t page = -1, snap = -1;
  uint64_t page_tick = 0, snap_tick = 0;
  int children = 0;
};

class Model {
 public:
  explicit Model(const RadixCacheConfig& c) : cfg_(c) {}
  std::map<std::vector<int32_t>, ModelNode> nodes;  // key: tokens of the prefix (a multiple of block_tokens)
  std::map<int32_t, std::vector<int32_t>> page_owner;
  uint64_t clock = 0;

  static std::vector<int32_t> prefix(const std::vector<int32_t>& t, int64_t blocks, int64_t bt) {
    return {t.begin(), t.begin() + blocks * bt};
  }
  double page_score(const std::vector<int32_t>& k, const ModelNode& n) const {
    const double d = static_cast<double>(k.size() / static_cast<size_t>(cfg_.block_tokens));
    const bool bonus = !cfg_.needs_snapshot || n.snap >= 0;
    return static_cast<double>(n.page_tick) + (bonus ? cfg_.depth_weight * std::log2(1 + d) : 0.0);
  }
  double snap_score(const std::vector<int32_t>& k, const ModelNode& n) const {
    const double d = static_cast<double>(k.size() / static_cast<size_t>(cfg_.block_tokens));
    return static_cast<double>(n.snap_tick) + cfg_.depth_weight * std::log2(1 + d);
  }
  int64_t cached_run(const std::vector<int32_t>& t, int64_t blocks) const {
    int64_t k = 0;
    while (k < blocks && nodes.count(prefix(t, k + 1, cfg_.block_tokens))) ++k;
    return k;
  }
  RadixCacheConfig cfg_;
};

void run_random(const RadixCacheConfig& cfg, uint32_t seed, int ops) {
  RadixCache rc(cfg);
  Model model(cfg);
  std::mt19937 rng(seed);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int64_t bt = cfg.block_tokens;
  const Digest root = chain_root("model", "salt");

  // A pool of sequences that share random prefixes; block contents from a tiny alphabet also collide by chance.
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<Digest>> seq_keys;
  auto new_seq = [&] {
    std::vector<int32_t> t;
    if (!seqs.empty() && rnd(0, 3) > 0) {
      const auto& parent = seqs[static_cast<size_t>(rnd(0, static_cast<int>(seqs.size()) - 1))];
      const int64_t pb = static_cast<int64_t>(parent.size()) / bt;
      t = Model::prefix(parent, rnd(0, static_cast<int>(pb)), bt);
    }
    const int add = rnd(1, 6);
    for (int b = 0; b < add; ++b)
      for (int64_t i = 0; i < bt; ++i) t.push_back(rnd(0, 2));
    std::vector<Digest> k;
    extend_block_keys(root, t, bt, k);
    if (seqs.size() < 60) {
      seqs.push_back(t);
      seq_keys.push_back(k);
    } else {
      const size_t i = static_cast<size_t>(rnd(0, 59));
      seqs[i] = t;
      seq_keys[i] = k;
    }
  };

  std::set<int32_t> adopted_pages, attached_snaps, dropped_pages, dropped_snaps, pinned;
  int32_t next_page = 0, next_snap = 0;
  int64_t hits = 0, evicted = 0, snaps_evicted = 0;

  auto check_counts = [&] {
    ASSERT_EQ(rc.cached_blocks(), static_cast<int64_t>(model.nodes.size()));
    int64_t s = 0;
    for (const auto& [k, n] : model.nodes) s += n.snap >= 0;
    ASSERT_EQ(rc.snapshots(), s);
    ASSERT_EQ(rc.tick(), model.clock);
  };

  for (int op = 0; op < ops; ++op) {
    if (seqs.empty() || rnd(0, 9) == 0) new_seq();
    const size_t si = static_cast<size_t>(rnd(0, static_cast<int>(seqs.size()) - 1));
    const auto& t = seqs[si];
    const auto& keys = seq_keys[si];
    const int64_t nb = rnd(1, static_cast<int>(keys.size()));
    const std::span<const Digest> kspan(keys.data(), static_cast<size_t>(nb));
    const int kind = rnd(0, 99);
    if (kind < 30) {  // insert
      std::vector<int32_t> pages(static_cast<size_t>(nb));
      for (auto& p : pages) p = next_page++;
      std::vector<int32_t> expect_adopted;
      ++model.clock;
      for (int64_t b = 0; b < nb; ++b) {
        const auto k = Model::prefix(t, b + 1, bt);
        auto it = model.nodes.find(k);
        if (it == model.nodes.end()) {
          ModelNode n;
          n.page = pages[static_cast<size_t>(b)];
          it = model.nodes.emplace(k, n).first;
          model.page_owner[n.page] = k;
          if (b > 0) ++model.nodes[Model::prefix(t, b, bt)].children;
          expect_adopted.push_back(n.page);
        }
        it->second.page_tick = model.clock;
      }
      std::vector<int32_t> adopted;
      ASSERT_TRUE(rc.insert(kspan, pages, adopted));
      ASSERT_EQ(adopted, expect_adopted);
      for (int32_t p : adopted) ASSERT_TRUE(adopted_pages.insert(p).second);
    } else if (kind < 45) {  // attach a snapshot
      const auto k = Model::prefix(t, nb, bt);
      auto it = model.nodes.find(k);
      const bool expect = it != model.nodes.end() && it->second.snap < 0;
      const int32_t s = next_snap++;
      ASSERT_EQ(rc.attach_snapshot(kspan, s), expect);
      ASSERT_EQ(rc.has_node(kspan), it != model.nodes.end());
      if (expect) {
        it->second.snap = s;
        it->second.snap_tick = ++model.clock;
        attached_snaps.insert(s);
      }
      ASSERT_EQ(rc.has_snapshot(kspan), it != model.nodes.end());
    } else if (kind < 80) {  // match
      const int64_t run = model.cached_run(t, nb);
      int64_t blocks = run;
      if (cfg.needs_snapshot) {
        while (blocks > 0 && model.nodes.at(Model::prefix(t, blocks, bt)).snap < 0) --blocks;
      }
      const auto m = rc.match(kspan);
      ++model.clock;
      ASSERT_EQ(m.page_blocks, run);
      ASSERT_EQ(m.blocks, blocks);
      ASSERT_EQ(static_cast<int64_t>(m.pages.size()), blocks);
      for (int64_t b = 0; b < blocks; ++b) {
        ModelNode& n = model.nodes.at(Model::prefix(t, b + 1, bt));
        ASSERT_EQ(m.pages[static_cast<size_t>(b)], n.page);
        n.page_tick = model.clock;
      }
      if (cfg.needs_snapshot && blocks > 0) {
        ModelNode& n = model.nodes.at(Model::prefix(t, blocks, bt));
        ASSERT_EQ(m.snapshot, n.snap);
        n.snap_tick = model.clock;
        ++hits;
      } else {
        ASSERT_EQ(m.snapshot, -1);
        hits += blocks > 0;
      }
    } else if (kind < 88) {  // pin or unpin a cached page (a running sequence shares it)
      if (!model.page_owner.empty()) {
        auto it = model.page_owner.begin();
        std::advance(it, rnd(0, static_cast<int>(model.page_owner.size()) - 1));
        if (!pinned.erase(it->first)) pinned.insert(it->first);
      }
    } else if (kind < 96) {  // evict pages
      const int64_t n = rnd(1, 8);
      int64_t seen = 0;
      int32_t expect_snap = -1;
      auto evictable = [&](int32_t p) { return !pinned.count(p); };
      auto drop_page = [&](int32_t p) {
        ASSERT_EQ(expect_snap, -1) << "the previous node's snapshot was not dropped";
        ASSERT_TRUE(dropped_pages.insert(p).second) << "page dropped twice: " << p;
        ASSERT_TRUE(model.page_owner.count(p)) << "page never adopted: " << p;
        ASSERT_FALSE(pinned.count(p));
        const auto k = model.page_owner.at(p);
        const ModelNode node = model.nodes.at(k);
        ASSERT_EQ(node.children, 0) << "evicted a node with children";
        const double score = model.page_score(k, node);
        for (const auto& [ok, on] : model.nodes) {
          if (on.children == 0 && !pinned.count(on.page)) {
            ASSERT_LE(score, model.page_score(ok, on) + 1e-9) << "a lower-priority leaf was evicted first";
          }
        }
        if (k.size() > static_cast<size_t>(bt)) --model.nodes.at({k.begin(), k.end() - bt}).children;
        model.nodes.erase(k);
        model.page_owner.erase(p);
        expect_snap = node.snap;
        ++seen;
      };
      auto drop_snap = [&](int32_t s) {
        ASSERT_EQ(s, expect_snap);
        ASSERT_TRUE(dropped_snaps.insert(s).second) << "snapshot dropped twice: " << s;
        expect_snap = -1;
      };
      const int64_t got = rc.evict_pages(n, evictable, drop_page, drop_snap);
      ASSERT_EQ(expect_snap, -1);
      ASSERT_EQ(got, seen);
      ASSERT_LE(got, n);
      if (got < n) {  // nothing evictable was left
        for (const auto& [k, on] : model.nodes) ASSERT_FALSE(on.children == 0 && !pinned.count(on.page));
      }
      evicted += got;
    } else {  // evict a snapshot
      bool called = false;
      const bool any = std::any_of(model.nodes.begin(), model.nodes.end(),
                                   [](const auto& kv) { return kv.second.snap >= 0; });
      const bool r = rc.evict_snapshot([&](int32_t s) {
        ASSERT_FALSE(called);
        called = true;
        ASSERT_TRUE(dropped_snaps.insert(s).second) << "snapshot dropped twice: " << s;
        const std::vector<int32_t>* key = nullptr;
        double best = 1e300;
        for (const auto& [k, on] : model.nodes)
          if (on.snap >= 0) best = std::min(best, model.snap_score(k, on));
        for (auto& [k, on] : model.nodes)
          if (on.snap == s) key = &k;
        ASSERT_NE(key, nullptr) << "unknown snapshot " << s;
        ModelNode& node = model.nodes.at(*key);
        ASSERT_LE(model.snap_score(*key, node), best + 1e-9) << "a lower-priority snapshot was evicted first";
        node.snap = -1;
      });
      ASSERT_EQ(r, any);
      ASSERT_EQ(called, any);
      snaps_evicted += r;
    }
    check_counts();
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Everything adopted comes back exactly once: by eviction or by clear.
  rc.clear([&](int32_t p) { ASSERT_TRUE(dropped_pages.insert(p).second) << "page dropped twice: " << p; },
           [&](int32_t s) { ASSERT_TRUE(dropped_snaps.insert(s).second) << "snapshot dropped twice: " << s; });
  EXPECT_EQ(dropped_pages, adopted_pages);
  EXPECT_EQ(dropped_snaps, attached_snaps);
  EXPECT_EQ(rc.cached_blocks(), 0);
  // The run must have exercised every path.
  EXPECT_GT(hits, ops / 10);
  EXPECT_GT(evicted, ops / 5);
  EXPECT_GT(snaps_evicted, ops / 50);
}

TEST(RadixCacheRandom, HybridAgainstBruteForceModel) {
  RadixCacheConfig c;
  c.block_tokens = 2;
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    run_random(c, seed, 4000);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(RadixCacheRandom, PagesOnlyAgainstBruteForceModel) {
  RadixCacheConfig c;
  c.block_tokens = 2;
  c.needs_snapshot = false;
  c.depth_weight = 3.0;
  for (uint32_t seed : {7u, 8u}) {
    SCOPED_TRACE(seed);
    run_random(c, seed, 4000);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kestrel
