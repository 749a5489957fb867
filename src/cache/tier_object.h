// One object of the prefix cache's lower tiers (disk, shared store): the bytes cached for one boundary of a key
// chain (cache/block_hash.h), framed so that a reader can trust nothing it did not check.
//
// Layout (integers little-endian), 88-byte header, payload, 32-byte trailer:
//    0  magic "KTOB"                    4 bytes
//    4  format version (1)              u16
//    6  payload kind (1 pages, 2 snapshot)  u8
//    7  flags (0)                       u8
//    8  blocks in the payload           u32   pages: >= 1, payload = blocks * equal-sized block records;
//                                             snapshot: 0, payload = fp32 values (length % 4 == 0)
//   12  reserved (0)                    u32
//   16  boundary key                    32    key[i] of the last block the payload belongs to
//   48  model digest                    32    model_digest(fingerprint) of the writer
//   80  payload length                  u64   must equal the object size - 120 exactly
//   88  payload
//  end  SHA-256 of header + payload     32
//
// The key already binds the model and the tenant; the model digest is checked again so that an object filed under
// the wrong name (a store shared by misconfigured servers, a renamed file) is refused instead of restoring another
// model's state. The checksum catches torn writes (the disk store renames without fsync) and bit rot; a reader that
// gets an error should erase the object.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "cache/block_hash.h"

namespace kestrel {

enum class TierPayloadKind : uint8_t { kPages = 1, kSnapshot = 2 };

inline constexpr uint16_t kTierObjectVersion = 1;
inline constexpr size_t kTierObjectHeaderBytes = 88;
inline constexpr size_t kTierObjectTrailerBytes = 32;

struct TierObject {
  Digest key{};    // the boundary
  Digest model{};  // model_digest() of the writer's fingerprint
  TierPayloadKind kind = TierPayloadKind::kPages;
  uint32_t blocks = 0;
  std::vector<uint8_t> payload;
};

// SHA-256 of a model fingerprint string (the one given to chain_root), as stored in objects.
Digest model_digest(std::string_view model_fingerprint);

// The name an object is stored under: the pages and the snapshot of one boundary are two objects, so the store key
// binds the kind as well as the boundary.
Digest tier_store_key(const Digest& boundary, TierPayloadKind kind);
// The name of a pages object holding blocks [first, end) (a segment, cache/tier_segments.h) whose last block has
// the key `end_key`. A segment that starts at block 0 keeps the boundary's pages name; the others bind `first`
// too, so that servers grouping blocks differently never read each other's segments as their own.
Digest tier_segment_key(const Digest& end_key, int64_t first);

// Requires a valid object (kind known, blocks/payload consistent with the kind); KCHECK otherwise.
std::vector<uint8_t> serialize_tier_object(const TierObject& obj);

// A verified object read in place: `payload` points into the bytes given to parse_tier_object_view (valid while
// they are); the key, model and kind are the ones the caller asked for.
struct TierObjectView {
  TierPayloadKind kind = TierPayloadKind::kPages;
  uint32_t blocks = 0;
  std::span<const uint8_t> payload;
};

// Parses bytes read back from a store. Every field and length is checked, the checksum verified and the identity
// compared with what the caller asked for; any mismatch is a kCorrupt error (kUnsupported for another format
// version) and no object is returned.
Result<TierObject> parse_tier_object(std::span<const uint8_t> bytes, const Digest& expected_key,
                                     const Digest& expected_model, TierPayloadKind expected_kind);
// The same checks, without copying the payload out.
Result<TierObjectView> parse_tier_object_view(std::span<const uint8_t> bytes, const Digest& expected_key,
                                              const Digest& expected_model, TierPayloadKind expected_kind);

}  // namespace kestrel
