// The lower tiers' object format (cache/tier_object.h): round trips, and a parser that refuses every damaged,
// truncated, foreign or misfiled object.
#include "cache/tier_object.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>

namespace kestrel {
namespace {

Digest digest_of(uint8_t seed) {
  Digest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(seed * 31 + i);
  return d;
}

TierObject pages_object(uint32_t blocks, size_t block_bytes) {
  TierObject o;
  o.key = digest_of(1);
  o.model = model_digest("k3-test fingerprint");
  o.kind = TierPayloadKind::kPages;
  o.blocks = blocks;
  o.payload.resize(blocks * block_bytes);
  for (size_t i = 0; i < o.payload.size(); ++i) o.payload[i] = static_cast<uint8_t>(i * 7 + 3);
  return o;
}

Result<TierObject> parse_as(const std::vector<uint8_t>& bytes, const TierObject& want) {
  return parse_tier_object(bytes, want.key, want.model, want.kind);
}

TEST(TierObject, PagesRoundTrip) {
  const TierObject o = pages_object(3, 40);
  const std::vector<uint8_t> bytes = serialize_tier_object(o);
  EXPECT_EQ(bytes.size(), kTierObjectHeaderBytes + 120 + kTierObjectTrailerBytes);
  auto back = parse_as(bytes, o);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->key, o.key);
  EXPECT_EQ(back->model, o.model);
  EXPECT_EQ(back->kind, TierPayloadKind::kPages);
  EXPECT_EQ(back->blocks, 3u);
  EXPECT_EQ(back->payload, o.payload);
  EXPECT_EQ(serialize_tier_object(*back), bytes);
}

TEST(TierObject, SnapshotRoundTrip) {
  TierObject o;
  o.key = digest_of(9);
  o.model = model_digest("m");
  o.kind = TierPayloadKind::kSnapshot;
  const std::vector<float> state = {1.5f, -2.0f, 0.0f, 3.25e-7f};
  o.payload.resize(state.size() * 4);
  std::memcpy(o.payload.data(), state.data(), o.payload.size());
  auto back = parse_as(serialize_tier_object(o), o);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->kind, TierPayloadKind::kSnapshot);
  EXPECT_EQ(back->blocks, 0u);
  std::vector<float> got(state.size());
  std::memcpy(got.data(), back->payload.data(), back->payload.size());
  EXPECT_EQ(got, state);
}

TEST(TierObject, StoreKeysSeparateKindsAndBoundaries) {
  const Digest b = digest_of(4);
  EXPECT_NE(tier_store_key(b, TierPayloadKind::kPages), tier_store_key(b, TierPayloadKind::kSnapshot));
  EXPECT_NE(tier_store_key(b, TierPayloadKind::kPages), tier_store_key(digest_of(5), TierPayloadKind::kPages));
  EXPECT_EQ(tier_store_key(b, TierPayloadKind::kPages), tier_store_key(b, TierPayloadKind::kPages));
  EXPECT_NE(model_digest("a"), model_digest("b"));
}

// The bytes on disk and in Redis outlive a build: the layout, tier_store_key() and model_digest() are pinned to an
// encoding written independently with Python's hashlib and struct (the fuzz seed corpus/tier_object/seed_pages.bin).
TEST(TierObject, FormatIsStable) {
  TierObject o;
  o.key = tier_store_key(Digest{}, TierPayloadKind::kPages);
  o.model = model_digest("fuzz");
  o.kind = TierPayloadKind::kPages;
  o.blocks = 2;
  for (int i = 0; i < 64; ++i) o.payload.push_back(static_cast<uint8_t>(i));
  const std::vector<uint8_t> bytes = serialize_tier_object(o);
  ASSERT_EQ(bytes.size(), 184u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "KTOB");
  Digest whole{};
  unsigned int len = 0;
  ASSERT_EQ(EVP_Digest(bytes.data(), bytes.size(), whole.data(), &len, EVP_sha256(), nullptr), 1);
  EXPECT_EQ(to_hex(whole), "59732908216c8cb9865802d99fda2906713cf84412d8c3f315856d97d6d39106");
}

// Every single byte changed, in every position, in two different ways: never accepted.
TEST(TierObject, EverySingleByteCorruptionRejected) {
  const TierObject o = pages_object(2, 24);
  const std::vector<uint8_t> good = serialize_tier_object(o);
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0xff}}) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= flip;
      auto r = parse_as(bad, o);
      ASSERT_FALSE(r) << "byte " << i << " ^ " << int{flip} << " accepted";
      EXPECT_TRUE(r.error().code() == StatusCode::kCorrupt || r.error().code() == StatusCode::kUnsupported)
          << r.error().message();
    }
  }
}

TEST(TierObject, EveryTruncationAndExtensionRejected) {
  const TierObject o = pages_object(2, 24);
  const std::vector<uint8_t> good = serialize_tier_object(o);
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = parse_tier_object(std::span<const uint8_t>(good.data(), n), o.key, o.model, o.kind);
    ASSERT_FALSE(r) << "truncation to " << n << " bytes accepted";
    EXPECT_EQ(r.error().code(), StatusCode::kCorrupt);
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_FALSE(parse_as(longer, o));
}

TEST(TierObject, IdentityMismatchRejected) {
  const TierObject o = pages_object(1, 16);
  const std::vector<uint8_t> bytes = serialize_tier_object(o);
  auto wrong_key = parse_tier_object(bytes, digest_of(2), o.model, o.kind);
  ASSERT_FALSE(wrong_key);
  EXPECT_NE(wrong_key.error().message().find("another boundary key"), std::string::npos);
  auto wrong_model = parse_tier_object(bytes, o.key, model_digest("another model"), o.kind);
  ASSERT_FALSE(wrong_model);
  EXPECT_NE(wrong_model.error().message().find("another model"), std::string::npos);
  auto wrong_kind = parse_tier_object(bytes, o.key, o.model, TierPayloadKind::kSnapshot);
  ASSERT_FALSE(wrong_kind);
  EXPECT_NE(wrong_kind.error().message().find("payload kind"), std::string::npos);
}

TEST(TierObject, OtherVersionIsUnsupported) {
  const TierObject o = pages_object(1, 8);
  std::vector<uint8_t> bytes = serialize_tier_object(o);
  bytes[4] = 2;
  auto r = parse_as(bytes, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.error().message().find("version 2"), std::string::npos);
}

TEST(TierObject, HugeDeclaredLengthRejectedWithoutAllocating) {
  const TierObject o = pages_object(1, 8);
  std::vector<uint8_t> bytes = serialize_tier_object(o);
  for (int i = 0; i < 8; ++i) bytes[80 + i] = 0xff;  // payload length 2^64 - 1
  auto r = parse_as(bytes, o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("payload length"), std::string::npos);
}

TEST(TierObjectDeathTest, SerializingAnInvalidObjectDies) {
  TierObject o = pages_object(3, 10);
  o.payload.pop_back();  // 29 bytes do not split into 3 equal blocks
  EXPECT_DEATH(serialize_tier_object(o), "invalid object");
  TierObject s;
  s.kind = TierPayloadKind::kSnapshot;
  s.payload.resize(6);  // not whole floats
  EXPECT_DEATH(serialize_tier_object(s), "invalid object");
}

}  // namespace
}  // namespace kestrel
