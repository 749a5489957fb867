// Vocab: the mergeable BPE ranks of a tiktoken-format file (`tiktoken.model`, `*.tiktoken`).
// File format: one `base64(token_bytes) SP rank` per line; empty lines are skipped (as tiktoken does).
// Validation is strict: bad base64, empty tokens, bad or duplicate ranks, duplicate tokens, and rank gaps are
// errors naming the file and line. Ranks are token ids: ids 0..size()-1 all exist.
// Immutable after load; all const methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace kestrel::chat {

enum class VocabFormat {
  kRawBytes,       // tiktoken: the base64 payload is the token's bytes
  kGpt2ByteLevel,  // HF byte-level BPE stored as tiktoken: the payload is the GPT-2 `bytes_to_unicode` string
};

class Vocab {
 public:
  static Result<Vocab> load(const std::string& path, VocabFormat format = VocabFormat::kRawBytes);
  // `name` only labels error messages.
  static Result<Vocab> parse(std::string_view text, std::string_view name,
                             VocabFormat format = VocabFormat::kRawBytes);

  Vocab() = default;

  // Number of ids in the file (ranks 0..size()-1).
  int32_t size() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  // Raw bytes of token `id` (0 <= id < size()).
  std::string_view bytes(int32_t id) const {
    return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  // Rank of a mergeable token with exactly these bytes, or -1.
  int32_t rank(const char* p, size_t n) const {
    if (n == 1) return short_ranks_[static_cast<uint8_t>(p[0])];
    if (n == 2) return short_ranks_[256 + (static_cast<uint8_t>(p[0]) << 8 | static_cast<uint8_t>(p[1]))];
    return rank_long(p, n);
  }
  int32_t rank(std::string_view s) const { return rank(s.data(), s.size()); }
  // False for kGpt2ByteLevel entries that are not byte-level strings (e.g. DeepSeek's `<｜begin▁of▁sentence｜>`):
  // they keep their text as bytes, decode normally, and are never produced by BPE.
  bool mergeable(int32_t id) const { return mergeable_[id] != 0; }

 private:
  void build_index();
  int32_t rank_long(const char* p, size_t n) const;

  std::string arena_;              // all token bytes, id order
  std::vector<uint32_t> offsets_;  // size()+1 offsets into arena_
  std::vector<uint8_t> mergeable_;
  // Open addressing, power-of-two size: (hash >> 32) << 32 | (id + 1); 0 = empty. The hash tag settles almost
  // every miss (most BPE pair lookups) without touching the token bytes.
  std::vector<uint64_t> slots_;
  uint64_t mask_ = 0;
  // Direct tables for 1- and 2-byte tokens (-1 = none): the initial pair lookups of every BPE merge.
  std::vector<int32_t> short_ranks_ = std::vector<int32_t>(256 + 65536, -1);
};

// Hash used by the rank index (exposed for the piece cache).
uint64_t hash_bytes(const char* p, size_t n);

}  // namespace kestrel::chat
