// Tokenizer: tiktoken-compatible BPE (vocabulary + special tokens + pre-tokenizer + optional Kimi caps).
//
// Encoding = (Kimi only) chunk by the caps of `tokenization_kimi.py` -> split out special tokens (kAllow) ->
// pre-tokenize each remaining segment separately -> BPE each piece. Matches `tiktoken.Encoding.encode` with
// allowed_special="all" (kAllow) or disallowed_special=() (kAsText) for the same vocabulary and pattern.
// Specials are matched leftmost-longest (tiktoken's order between a special and its own prefix is unspecified).
//
// Invalid UTF-8: tiktoken's encode() takes a Python str, so it never sees invalid bytes. encode() here replaces
// each maximal invalid subpart with U+FFFD first, i.e. it encodes bytes.decode("utf-8", "replace"). To keep the
// exact bytes use encode_bytes(): valid runs are encoded as by encode(), each maximal invalid run is BPE'd as one
// raw piece, so decode(encode_bytes(x)) == x for every x. (tiktoken's private `_encode_bytes` instead BPEs
// everything after the first invalid byte as one piece; we do not copy that.)
//
// Immutable after create(); every const method is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "chat/pretokenizer.h"
#include "chat/vocab.h"

namespace kestrel::chat {

enum class SpecialMode {
  kAllow,   // special-token strings in the text become their ids (structural markers)
  kAsText,  // special-token strings are ordinary text (user / tool content: cannot forge control tokens)
};

struct SpecialToken {
  std::string text;
  int32_t id = 0;
};

// Pre-splitting caps of Kimi's `tokenization_kimi.py` (`encode`): the text is cut into chunks of at most
// `max_chunk_chars` code points, and each chunk wherever a run of whitespace / non-whitespace (Python
// str.isspace) would exceed `max_run_chars`. The cuts change ids, so they are part of the tokenizer.
struct ChunkCaps {
  size_t max_chunk_chars = 400'000;
  size_t max_run_chars = 25'000;
};

struct TokenizerConfig {
  std::string vocab_path;
  VocabFormat vocab_format = VocabFormat::kRawBytes;
  Pattern pattern = Pattern::kCl100k;
  std::optional<ChunkCaps> caps;  // set for Kimi only; plain tiktoken vocabularies have none
  std::vector<SpecialToken> specials;
};

// Kimi K3 (docs/model-math.md §4.1-4.4): 163,584 ranks + 256 specials/reserved (163584..163839), Kimi
// pattern and caps.
TokenizerConfig kimi_k3_config(std::string vocab_path);
// The Kimi K3 special-token table (named ones from docs/model-math.md §4.4, the rest `<|reserved_token_ID|>`).
std::vector<SpecialToken> kimi_k3_specials(int32_t first_id = 163584);
// Reference vocabularies with their own patterns and specials (tiktoken / upstream tables).
TokenizerConfig cl100k_config(std::string vocab_path);
TokenizerConfig o200k_config(std::string vocab_path);
TokenizerConfig llama3_config(std::string vocab_path);
TokenizerConfig deepseek_v3_config(std::string vocab_path);

class Tokenizer {
 public:
  static Result<Tokenizer> create(const TokenizerConfig& config);
  static Result<Tokenizer> create(Vocab vocab, PreTokenizer pre, std::vector<SpecialToken> specials,
                                  std::optional<ChunkCaps> caps);

  std::vector<int32_t> encode(std::string_view text, SpecialMode mode) const;
  std::vector<int32_t> encode_bytes(std::string_view bytes, SpecialMode mode) const;
  // Appending forms, for renderers that encode segment by segment into one buffer.
  void encode_append(std::string_view text, SpecialMode mode, std::vector<int32_t>& out) const;
  void encode_bytes_append(std::string_view bytes, SpecialMode mode, std::vector<int32_t>& out) const;

  // Raw bytes of the ids, concatenated (not necessarily UTF-8). Unknown ids are an error naming the index.
  Result<std::string> decode(std::span<const int32_t> ids) const;
  // Bytes of one id (special tokens: their text), or nullopt if the id is not in the vocabulary.
  std::optional<std::string_view> token_bytes(int32_t id) const;

  std::optional<int32_t> special_id(std::string_view text) const;
  bool is_special(int32_t id) const;
  // One past the largest id (ranks and specials), e.g. 163,840 for Kimi K3.
  int32_t vocab_size() const { return static_cast<int32_t>(id_kind_.size()); }
  int32_t num_ranks() const { return vocab_.size(); }

 private:
  enum IdKind : uint8_t { kUnused, kRank, kSpecial };

  void encode_valid(std::string_view text, SpecialMode mode, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view text, SpecialMode mode, std::vector<int32_t>& out) const;
  size_t cut_outside_special(std::string_view text, size_t from, size_t pos, SpecialMode mode) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  // Finds the leftmost-longest special in text[from..]; returns {pos, index} or {npos, -1}.
  std::pair<size_t, int32_t> find_special(std::string_view text, size_t from) const;

  Vocab vocab_;
  PreTokenizer pre_;
  std::optional<ChunkCaps> caps_;
  std::vector<SpecialToken> specials_;             // sorted by text length, longest first
  std::array<bool, 256> special_first_byte_{};
  std::vector<uint8_t> id_kind_;                   // by id
  std::vector<int32_t> special_index_;             // by id: index into specials_ or -1
};

}  // namespace kestrel::chat
