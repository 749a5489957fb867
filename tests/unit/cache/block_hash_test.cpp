// Prefix-cache identity: the SHA-256 key chain (cache/block_hash.h).
#include "cache/block_hash.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kestrel {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::vector<Digest> keys_of(const Digest& root, const std::vector<int32_t>& t, int64_t bt,
                            std::span<const BlockExtraKey> extra = {}) {
  std::vector<Digest> out;
  extend_block_keys(root, t, bt, out, extra);
  return out;
}

// Expected digests computed independently with Python's hashlib from the encoding in block_hash.h:
//   field = lambda t, s: bytes([t]) + struct.pack('<Q', len(s)) + s
//   root = sha256(field(1, b"kestrel-prefix-v1") + field(2, b"fp") + field(3, b"salt"))
//   k0 = sha256(root + struct.pack('<ii', 1, -2)); k1 = sha256(k0 + struct.pack('<ii', 70000, 3))
//   k0x = sha256(root + struct.pack('<ii', 1, -2) + struct.pack('<q', 1) + bytes(range(32)))
TEST(BlockHash, KnownSha256Vectors) {
  const Digest root = chain_root("fp", "salt");
  EXPECT_EQ(to_hex(root), "196a8b66859287300c50b1b8e8ca0f3f446e92a044fea26eaa42bd12e8fb07b7");
  EXPECT_EQ(to_hex(chain_root("", "")), "affc73bde9a0c373fb322144a836c34fc891428285f40975ffb55eb2f3181f5d");
  const std::vector<int32_t> t = {1, -2, 70000, 3, 9};  // the trailing 9 is a partial block
  const auto k = keys_of(root, t, 2);
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(to_hex(k[0]), "0016b6aeada3a55182e48628d524da4c13be9687946eb2168f4f55d271126d7f");
  EXPECT_EQ(to_hex(k[1]), "3bbab8f828d30950aebef9af1900f9df9040e776fdcc4bbc78d852fbc2c4f8ed");
  Digest img{};
  for (int i = 0; i < 32; ++i) img[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  const BlockExtraKey ex[] = {{1, img}};
  const auto kx = keys_of(root, t, 2, ex);
  ASSERT_EQ(kx.size(), 2u);
  EXPECT_EQ(to_hex(kx[0]), "546e188166385909ed8f5bbf51579b37fd8f535c2ba3bd74a42086f3814e4fc9");
}

TEST(BlockHash, RootSeparatesFingerprintAndSalt) {
  const Digest a = chain_root("model-A", "");
  EXPECT_NE(a, chain_root("model-B", ""));
  EXPECT_NE(a, chain_root("model-A", "tenant"));
  EXPECT_EQ(a, chain_root("model-A", ""));
  // Length prefixes: moving bytes between fingerprint and salt changes the root.
  EXPECT_NE(chain_root("ab", "c"), chain_root("a", "bc"));
  const auto t = iota_tokens(128);
  const auto ka = keys_of(chain_root("m", "s1"), t, 64), kb = keys_of(chain_root("m", "s2"), t, 64);
  ASSERT_EQ(ka.size(), 2u);
  EXPECT_NE(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
}

TEST(BlockHash, IncrementalEqualsOneShot) {
  const Digest root = chain_root("fp", "");
  const auto t = iota_tokens(1000);
  const auto whole = keys_of(root, t, 16);
  ASSERT_EQ(whole.size(), 62u);  // 1000 / 16 = 62 full blocks; the 8-token tail has no key
  std::vector<Digest> inc;
  for (size_t n : {0u, 5u, 16u, 17u, 31u, 32u, 500u, 999u, 1000u}) {
    extend_block_keys(root, std::span<const int32_t>(t.data(), n), 16, inc);
    EXPECT_EQ(inc.size(), n / 16);
  }
  EXPECT_EQ(inc, whole);
  // Extending with no new full block is a no-op.
  extend_block_keys(root, t, 16, inc);
  EXPECT_EQ(inc, whole);
}

TEST(BlockHash, ChainBindsThePrefix) {
  const Digest root = chain_root("fp", "");
  auto t = iota_tokens(64);
  const auto base = keys_of(root, t, 16);
  t[20] += 1;  // block 1 changes: block 0 keeps its key, every later key changes
  const auto changed = keys_of(root, t, 16);
  EXPECT_EQ(changed[0], base[0]);
  for (size_t i = 1; i < base.size(); ++i) EXPECT_NE(changed[i], base[i]) << i;
  // The partial tail has no key: 63 tokens give 3 keys equal to the first 3 of the 64-token chain.
  auto t2 = iota_tokens(63);
  EXPECT_EQ(keys_of(root, t2, 16), std::vector<Digest>(base.begin(), base.begin() + 3));
}

TEST(BlockHash, ExtraKeysChangeExactlyTheirBlocks) {
  const Digest root = chain_root("fp", "");
  const auto t = iota_tokens(80);  // 5 blocks of 16
  const auto plain = keys_of(root, t, 16);
  Digest img1{}, img2{};
  img1[0] = 1;
  img2[0] = 2;
  // An image at position 40 (block 2): blocks 0,1 keep their keys; blocks 2.. differ (chained).
  const BlockExtraKey e1[] = {{40, img1}};
  const auto k1 = keys_of(root, t, 16, e1);
  EXPECT_EQ(k1[0], plain[0]);
  EXPECT_EQ(k1[1], plain[1]);
  for (size_t i = 2; i < 5; ++i) EXPECT_NE(k1[i], plain[i]) << i;
  // A different image at the same position gives different keys from block 2 on.
  const BlockExtraKey e2[] = {{40, img2}};
  const auto k2 = keys_of(root, t, 16, e2);
  EXPECT_EQ(k2[1], plain[1]);
  EXPECT_NE(k2[2], k1[2]);
  // The same image at another position inside the same block is a different key (the position is bound).
  const BlockExtraKey e3[] = {{41, img1}};
  EXPECT_NE(keys_of(root, t, 16, e3)[2], k1[2]);
  // Block boundaries: position 47 belongs to block 2, 48 to block 3.
  const BlockExtraKey e47[] = {{47, img1}}, e48[] = {{48, img1}};
  const auto k47 = keys_of(root, t, 16, e47), k48 = keys_of(root, t, 16, e48);
  EXPECT_NE(k47[2], plain[2]);
  EXPECT_EQ(k48[2], plain[2]);
  EXPECT_NE(k48[3], plain[3]);
  // An extra key in the partial tail is bound once its block fills, also incrementally.
  const BlockExtraKey tail[] = {{85, img1}};
  std::vector<Digest> inc;
  extend_block_keys(root, t, 16, inc, tail);
  EXPECT_EQ(inc, plain);
  auto longer = iota_tokens(96);
  extend_block_keys(root, longer, 16, inc, tail);
  const auto oneshot = keys_of(root, longer, 16, tail);
  EXPECT_EQ(inc, oneshot);
  EXPECT_NE(oneshot[5], keys_of(root, longer, 16)[5]);
  // Two extras in one block, incremental over extras split across calls == one shot.
  const BlockExtraKey two[] = {{3, img1}, {10, img2}, {70, img1}};
  std::vector<Digest> inc2;
  extend_block_keys(root, std::span<const int32_t>(t.data(), 20), 16, inc2, two);
  extend_block_keys(root, t, 16, inc2, two);
  EXPECT_EQ(inc2, keys_of(root, t, 16, two));
  const BlockExtraKey one[] = {{3, img1}};
  EXPECT_NE(keys_of(root, t, 16, two)[0], keys_of(root, t, 16, one)[0]);
}

TEST(BlockHash, HexIsLowerCase64) {
  Digest d{};
  d[0] = 0xAB;
  d[31] = 0x0F;
  const std::string h = to_hex(d);
  ASSERT_EQ(h.size(), 64u);
  EXPECT_EQ(h.substr(0, 2), "ab");
  EXPECT_EQ(h.substr(62), "0f");
}

}  // namespace
}  // namespace kestrel
