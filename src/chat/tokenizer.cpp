#include "chat/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "chat/bpe.h"
#include "chat/utf8.h"

namespace kestrel::chat {

TokenizerConfig kimi_k3_config(std::string vocab_path) {
  return {std::move(vocab_path), VocabFormat::kRawBytes, Pattern::kKimi, ChunkCaps{}, kimi_k3_specials()};
}

std::vector<SpecialToken> kimi_k3_specials(int32_t first_id) {
  // docs/model-math.md §4.4 table, as offsets from the first special id (163584 in K3).
  static const std::unordered_map<int32_t, std::string_view> kNamed = {
      {0, "[BOS]"},           {1, "[EOS]"},          {2, "<|end_of_msg|>"},    {3, "<|open|>"},
      {4, "<|close|>"},       {5, "<|sep|>"},        {6, "[start_header_id]"}, {7, "[end_header_id]"},
      {9, "[EOT]"},           {18, "<|media_begin|>"}, {19, "<|media_content|>"}, {20, "<|media_end|>"},
      {21, "<|media_pad|>"},  {65, "<osagent_mode>"}, {254, "[UNK]"},         {255, "[PAD]"},
  };
  std::vector<SpecialToken> out;
  out.reserve(256);
  for (int32_t k = 0; k < 256; ++k) {
    const int32_t id = first_id + k;
    auto it = kNamed.find(k);
    out.push_back({it != kNamed.end() ? std::string(it->second) : "<|reserved_token_" + std::to_string(id) + "|>",
                   id});
  }
  return out;
}

TokenizerConfig cl100k_config(std::string vocab_path) {
  // tiktoken_ext/openai_public.py cl100k_base special_tokens.
  return {std::move(vocab_path), VocabFormat::kRawBytes, Pattern::kCl100k, std::nullopt,
          {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
           {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}}};
}

TokenizerConfig o200k_config(std::string vocab_path) {
  return {std::move(vocab_path), VocabFormat::kRawBytes, Pattern::kO200k, std::nullopt,
          {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}};
}

TokenizerConfig llama3_config(std::string vocab_path) {
  // Meta llama3 tokenizer.py (3.1 names): 256 specials from 128000.
  static constexpr std::string_view kBasic[] = {
      "<|begin_of_text|>", "<|end_of_text|>",  "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
      "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
      "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  TokenizerConfig c{std::move(vocab_path), VocabFormat::kRawBytes, Pattern::kLlama3, std::nullopt, {}};
  int32_t id = 128000;
  for (std::string_view s : kBasic) c.specials.push_back({std::string(s), id++});
  for (int32_t k = 2; id < 128256; ++k) c.specials.push_back({"<|reserved_special_token_" + std::to_string(k) + "|>", id++});
  return c;
}

TokenizerConfig deepseek_v3_config(std::string vocab_path) {
  // The three non-byte-level entries of the file; everything else is byte-level BPE.
  return {std::move(vocab_path), VocabFormat::kGpt2ByteLevel, Pattern::kDeepSeekV3, std::nullopt,
          {{"<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>", 0},
           {"<\uFF5Cend\u2581of\u2581sentence\uFF5C>", 1},
           {"<\uFF5C\u2581pad\u2581\uFF5C>", 2}}};
}

Result<Tokenizer> Tokenizer::create(const TokenizerConfig& config) {
  auto vocab = Vocab::load(config.vocab_path, config.vocab_format);
  if (!vocab) return vocab.error();
  auto pre = PreTokenizer::create(config.pattern);
  if (!pre) return pre.error();
  return create(std::move(*vocab), std::move(*pre), config.specials, config.caps);
}

Result<Tokenizer> Tokenizer::create(Vocab vocab, PreTokenizer pre, std::vector<SpecialToken> specials,
                                    std::optional<ChunkCaps> caps) {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (vocab.rank(&c, 1) < 0) {
      return invalid_argument("vocabulary has no token for byte " + std::to_string(b) +
                              "; BPE needs all 256 single bytes");
    }
  }
  if (caps && (caps->max_chunk_chars == 0 || caps->max_run_chars == 0)) {
    return invalid_argument("chunk caps must be positive");
  }
  Tokenizer t;
  int32_t max_id = vocab.size() - 1;
  for (const SpecialToken& s : specials) {
    if (s.text.empty() || s.id < 0) return invalid_argument("special token needs text and an id >= 0");
    if (!utf8_is_valid(s.text)) return invalid_argument("special token '" + s.text + "' is not UTF-8");
    max_id = std::max(max_id, s.id);
  }
  t.id_kind_.assign(static_cast<size_t>(max_id) + 1, kUnused);
  t.special_index_.assign(t.id_kind_.size(), -1);
  for (int32_t id = 0; id < vocab.size(); ++id) t.id_kind_[id] = vocab.mergeable(id) ? kRank : kSpecial;
  std::sort(specials.begin(), specials.end(), [](const SpecialToken& a, const SpecialToken& b) {
    return a.text.size() != b.text.size() ? a.text.size() > b.text.size() : a.text < b.text;
  });
  std::unordered_map<std::string_view, int32_t> seen;
  for (size_t i = 0; i < specials.size(); ++i) {
    const SpecialToken& s = specials[i];
    if (!seen.emplace(s.text, s.id).second) return invalid_argument("duplicate special token '" + s.text + "'");
    const bool in_file = s.id < vocab.size();
    if (t.special_index_[s.id] >= 0 || (in_file && (vocab.mergeable(s.id) || vocab.bytes(s.id) != s.text))) {
      return invalid_argument("special token '" + s.text + "' reuses id " + std::to_string(s.id));
    }
    t.id_kind_[s.id] = kSpecial;
    t.special_index_[s.id] = static_cast<int32_t>(i);
    t.special_first_byte_[static_cast<uint8_t>(s.text[0])] = true;
  }
  t.vocab_ = std::move(vocab);
  t.pre_ = std::move(pre);
  t.caps_ = caps;
  t.specials_ = std::move(specials);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, SpecialMode mode) const {
  std::vector<int32_t> out;
  encode_append(text, mode, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_bytes(std::string_view bytes, SpecialMode mode) const {
  std::vector<int32_t> out;
  encode_bytes_append(bytes, mode, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, SpecialMode mode, std::vector<int32_t>& out) const {
  if (utf8_is_valid(text)) {
    encode_valid(text, mode, out);
  } else {
    encode_valid(utf8_replace_invalid(text), mode, out);
  }
}

void Tokenizer::encode_bytes_append(std::string_view bytes, SpecialMode mode, std::vector<int32_t>& out) const {
  size_t i = 0;
  while (i < bytes.size()) {
    size_t j = i;  // [i, j): valid run
    while (j < bytes.size()) {
      const Utf8Scan r = utf8_scan(bytes, j);
      if (!r.valid) break;
      j += r.len;
    }
    encode_valid(bytes.substr(i, j - i), mode, out);
    size_t k = j;  // [j, k): invalid run
    while (k < bytes.size()) {
      const Utf8Scan r = utf8_scan(bytes, k);
      if (r.valid) break;
      k += r.len;
    }
    bpe_encode(vocab_, bytes.substr(j, k - j), out);
    i = k;
  }
}

void Tokenizer::encode_valid(std::string_view text, SpecialMode mode, std::vector<int32_t>& out) const {
  if (!caps_) {
    encode_segment(text, mode, out);
    return;
  }
  // tokenization_kimi.py: for each chunk of max_chunk_chars code points, _split_whitespaces_or_nonwhitespaces.
  size_t chunk_chars = 0;
  size_t slice_start = 0, run_len = 0;
  bool run_is_space = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    const bool space = is_python_space(utf8_decode_valid(text.data() + pos, &len));
    if (chunk_chars == caps_->max_chunk_chars) {  // new outer chunk: flush and restart the run state
      const size_t cut = cut_outside_special(text, slice_start, pos, mode);
      encode_segment(text.substr(slice_start, cut - slice_start), mode, out);
      slice_start = cut;
      chunk_chars = 0;
    }
    if (chunk_chars == 0) {
      run_is_space = space;
      run_len = 0;
    }
    if (run_is_space != space) {
      run_len = 1;
      run_is_space = space;
    } else if (++run_len > caps_->max_run_chars) {
      const size_t cut = cut_outside_special(text, slice_start, pos, mode);
      encode_segment(text.substr(slice_start, cut - slice_start), mode, out);
      slice_start = cut;
      run_len = 1;
    }
    ++chunk_chars;
    pos += len;
  }
  encode_segment(text.substr(slice_start), mode, out);
}

// A cut at byte `pos` of a run, moved back to the start of an allowed special token that would straddle it. The
// reference cuts the rendered text blindly, but it expands an image's <|media_pad|> run at the id level, so no
// reference run ever holds thousands of pads; here they are rendered as text, and a cut inside one would turn
// it into ordinary tokens. Text without special tokens (and kAsText) is cut exactly as the reference cuts it.
size_t Tokenizer::cut_outside_special(std::string_view text, size_t from, size_t pos, SpecialMode mode) const {
  if (mode == SpecialMode::kAsText || specials_.empty()) return pos;
  const size_t longest = specials_.front().text.size();
  size_t p = pos > from + longest ? pos - longest : from;
  while (true) {
    const auto [at, index] = find_special(text, p);
    if (index < 0 || at >= pos) return pos;
    if (at + specials_[static_cast<size_t>(index)].text.size() > pos) return at;
    p = at + 1;
  }
}

std::pair<size_t, int32_t> Tokenizer::find_special(std::string_view text, size_t from) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!special_first_byte_[static_cast<uint8_t>(text[pos])]) continue;
    const std::string_view rest = text.substr(pos);
    for (size_t i = 0; i < specials_.size(); ++i) {  // longest first
      const std::string& s = specials_[i].text;
      if (s[0] == rest[0] && rest.size() >= s.size() && std::memcmp(rest.data(), s.data(), s.size()) == 0) {
        return {pos, static_cast<int32_t>(i)};
      }
    }
  }
  return {std::string_view::npos, -1};
}

void Tokenizer::encode_segment(std::string_view text, SpecialMode mode, std::vector<int32_t>& out) const {
  if (mode == SpecialMode::kAsText || specials_.empty()) {
    encode_ordinary(text, out);
    return;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [at, index] = find_special(text, pos);
    if (index < 0) break;
    encode_ordinary(text.substr(pos, at - pos), out);
    out.push_back(specials_[index].id);
    pos = at + specials_[index].text.size();
  }
  encode_ordinary(text.substr(std::min(pos, text.size())), out);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  pre_.split(text, pieces);
  for (std::string_view piece : pieces) bpe_encode(vocab_, piece, out);
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto b = token_bytes(ids[i]);
    if (!b) {
      return invalid_argument("decode: id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                              " is not in the vocabulary");
    }
    out.append(*b);
  }
  return out;
}

std::optional<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return std::nullopt;
  if (special_index_[id] >= 0) return std::string_view(specials_[special_index_[id]].text);
  if (id < vocab_.size()) return vocab_.bytes(id);
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::special_id(std::string_view text) const {
  for (const SpecialToken& s : specials_) {
    if (s.text == text) return s.id;
  }
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && id_kind_[id] == kSpecial;
}

}  // namespace kestrel::chat
