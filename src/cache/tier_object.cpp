#include "cache/tier_object.h"

#include <openssl/evp.h>

#include <cstring>
#include <string>

#include "base/check.h"

namespace kestrel {
namespace {

constexpr uint8_t kMagic[4] = {'K', 'T', 'O', 'B'};
constexpr size_t kOffVersion = 4, kOffKind = 6, kOffFlags = 7, kOffBlocks = 8, kOffReserved = 12, kOffKey = 16,
                 kOffModel = 48, kOffLength = 80;

Digest sha256(const uint8_t* p, size_t n) {
  Digest d{};
  unsigned int len = 0;
  KCHECK(EVP_Digest(p, n, d.data(), &len, EVP_sha256(), nullptr) == 1 && len == d.size(), "tier_object: SHA-256 failed");
  return d;
}

void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Checks the kind / block count / payload length triple; shared by the writer (as an invariant) and the reader.
const char* shape_error(uint8_t kind, uint64_t blocks, uint64_t payload_len) {
  if (kind == static_cast<uint8_t>(TierPayloadKind::kPages)) {
    if (blocks == 0) return "a pages object with zero blocks";
    if (payload_len == 0 || payload_len % blocks != 0) return "pages payload is not a whole number of equal blocks";
    return nullptr;
  }
  if (kind == static_cast<uint8_t>(TierPayloadKind::kSnapshot)) {
    if (blocks != 0) return "a snapshot object with a block count";
    if (payload_len == 0 || payload_len % 4 != 0) return "snapshot payload is not a whole number of fp32 values";
    return nullptr;
  }
  return "unknown payload kind";
}

Status bad(const std::string& what) { return corrupt("tier object: " + what); }

}  // namespace

Digest model_digest(std::string_view model_fingerprint) {
  std::string s = "kestrel-tier-model-v1";
  s.push_back('\0');
  s.append(model_fingerprint);
  return sha256(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

Digest tier_store_key(const Digest& boundary, TierPayloadKind kind) {
  uint8_t buf[16 + 1 + 32] = "kestrel-tier-v1";  // 15 chars + NUL, then kind, then the boundary
  buf[16] = static_cast<uint8_t>(kind);
  std::memcpy(buf + 17, boundary.data(), boundary.size());
  return sha256(buf, sizeof(buf));
}

Digest tier_segment_key(const Digest& end_key, int64_t first) {
  KCHECK(first >= 0, "tier_segment_key: a first block is not negative");
  const Digest pages = tier_store_key(end_key, TierPayloadKind::kPages);
  if (first == 0) return pages;
  uint8_t buf[20 + 32 + 8] = "kestrel-tier-segment";  // 20 chars (no NUL kept), the pages name, then first (LE)
  std::memcpy(buf + 20, pages.data(), pages.size());
  for (int i = 0; i < 8; ++i) buf[52 + i] = static_cast<uint8_t>(static_cast<uint64_t>(first) >> (8 * i));
  return sha256(buf, sizeof(buf));
}

std::vector<uint8_t> serialize_tier_object(const TierObject& obj) {
  const char* err = shape_error(static_cast<uint8_t>(obj.kind), obj.blocks, obj.payload.size());
  KCHECK(err == nullptr, "serialize_tier_object: invalid object");
  std::vector<uint8_t> out(kTierObjectHeaderBytes + obj.payload.size() + kTierObjectTrailerBytes, 0);
  uint8_t* h = out.data();
  std::memcpy(h, kMagic, sizeof(kMagic));
  put_le(h + kOffVersion, kTierObjectVersion, 2);
  h[kOffKind] = static_cast<uint8_t>(obj.kind);
  put_le(h + kOffBlocks, obj.blocks, 4);
  std::memcpy(h + kOffKey, obj.key.data(), 32);
  std::memcpy(h + kOffModel, obj.model.data(), 32);
  put_le(h + kOffLength, obj.payload.size(), 8);
  if (!obj.payload.empty()) std::memcpy(h + kTierObjectHeaderBytes, obj.payload.data(), obj.payload.size());
  const size_t body = kTierObjectHeaderBytes + obj.payload.size();
  const Digest sum = sha256(h, body);
  std::memcpy(h + body, sum.data(), sum.size());
  return out;
}

Result<TierObjectView> parse_tier_object_view(std::span<const uint8_t> bytes, const Digest& expected_key,
                                              const Digest& expected_model, TierPayloadKind expected_kind) {
  constexpr size_t kFrame = kTierObjectHeaderBytes + kTierObjectTrailerBytes;
  if (bytes.size() < kFrame)
    return bad("truncated: " + std::to_string(bytes.size()) + " bytes, the frame alone is " + std::to_string(kFrame));
  const uint8_t* h = bytes.data();
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) return bad("bad magic");
  const uint64_t version = get_le(h + kOffVersion, 2);
  if (version != kTierObjectVersion)
    return unsupported("tier object: format version " + std::to_string(version) + ", this build reads " +
                       std::to_string(kTierObjectVersion));
  if (h[kOffFlags] != 0 || get_le(h + kOffReserved, 4) != 0) return bad("reserved header bits set");
  // Compare against the bytes we hold rather than computing header + length, which could overflow.
  const uint64_t payload_len = get_le(h + kOffLength, 8);
  if (payload_len != bytes.size() - kFrame)
    return bad("payload length " + std::to_string(payload_len) + " does not match the object size " +
               std::to_string(bytes.size()));
  const uint64_t blocks = get_le(h + kOffBlocks, 4);
  if (const char* err = shape_error(h[kOffKind], blocks, payload_len)) return bad(err);
  const size_t body = kTierObjectHeaderBytes + payload_len;
  const Digest sum = sha256(h, body);
  if (std::memcmp(sum.data(), h + body, sum.size()) != 0) return bad("checksum mismatch");
  // Identity last: a well-formed object under the wrong name is reported as such, not as damage.
  if (std::memcmp(h + kOffKey, expected_key.data(), 32) != 0) return bad("holds another boundary key");
  if (std::memcmp(h + kOffModel, expected_model.data(), 32) != 0) return bad("written for another model");
  if (h[kOffKind] != static_cast<uint8_t>(expected_kind)) return bad("holds another payload kind");
  TierObjectView v;
  v.kind = static_cast<TierPayloadKind>(h[kOffKind]);
  v.blocks = static_cast<uint32_t>(blocks);
  v.payload = bytes.subspan(kTierObjectHeaderBytes, static_cast<size_t>(payload_len));
  return v;
}

Result<TierObject> parse_tier_object(std::span<const uint8_t> bytes, const Digest& expected_key,
                                     const Digest& expected_model, TierPayloadKind expected_kind) {
  auto v = parse_tier_object_view(bytes, expected_key, expected_model, expected_kind);
  if (!v) return v.error();
  TierObject obj;
  obj.key = expected_key;  // verified equal
  obj.model = expected_model;
  obj.kind = v->kind;
  obj.blocks = v->blocks;
  obj.payload.assign(v->payload.begin(), v->payload.end());
  return obj;
}

}  // namespace kestrel
