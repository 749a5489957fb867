// Identity of cached prefix blocks: a chain of SHA-256 digests (docs/architecture.md §9).
//
//   root   = SHA-256(field("kestrel-prefix-v1") || field(model_fingerprint) || field(cache_salt))
//            field(s) = one type byte || u64 little-endian length || bytes
//   key[0] = SHA-256(root   || block 0)          block i = its block_tokens token ids as int32 little-endian,
//   key[i] = SHA-256(key[i-1] || block i)                   then every extra key whose position falls inside
//                                                            the block, in order: position int64 LE || 32-byte hash
//
// key[i] therefore names the whole prefix of blocks 0..i under one model and one tenant: a different fingerprint,
// salt, token or image anywhere before block i gives a different key. Only full blocks have a key. The encoding of a
// block has a fixed token part and 40-byte extra records, so two different inputs cannot serialise to the same bytes.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel {

using Digest = std::array<uint8_t, 32>;

// Root of a key chain. `model_fingerprint` is built by the caller (weights digest + kernels mode + cache dtype +
// page size, ...); `cache_salt` is the request's tenant salt (empty when none). Different fingerprint or salt =>
// different root => no shared hits.
Digest chain_root(std::string_view model_fingerprint, std::string_view cache_salt);

// Extra key bound into the block that holds token `position` (e.g. an image content hash at its placeholder).
struct BlockExtraKey {
  int64_t position;
  Digest hash;
};

// Appends the keys of blocks out.size() .. floor(tokens.size() / block_tokens) - 1 to `out`, chaining from
// out.back() (or `root` when `out` is empty), so a sequence's chain is extended as it grows; the result equals one
// call over the whole sequence. `extra` must be sorted by position (positions >= 0); keys beyond the last full block
// are bound once their block is full. Requires block_tokens > 0.
void extend_block_keys(const Digest& root, std::span<const int32_t> tokens, int64_t block_tokens,
                       std::vector<Digest>& out, std::span<const BlockExtraKey> extra = {});

// Lower-case hex of the 32 bytes (64 characters).
std::string to_hex(const Digest& d);

}  // namespace kestrel
