#include "chat/vocab.h"

#include <algorithm>

#include <array>
#include <charconv>
#include <cstring>

#include "base/mapped_file.h"
#include "chat/utf8.h"

namespace kestrel::chat {

namespace {

constexpr std::array<int8_t, 256> make_base64_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(a[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr auto kBase64 = make_base64_table();

// Strict standard base64 with '=' padding. Returns false on any malformed input.
bool base64_decode(std::string_view in, std::string* out) {
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = in[in.size() - 2] == '=' ? 2 : 1;
  out->clear();
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      const bool in_pad = i + 4 == in.size() && k >= 4 - pad;
      int8_t d = in_pad ? (c == '=' ? 0 : -1) : kBase64[static_cast<uint8_t>(c)];
      if (d < 0) return false;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out->push_back(static_cast<char>(v >> 16));
    if (!(i + 4 == in.size() && pad == 2)) out->push_back(static_cast<char>((v >> 8) & 0xFF));
    if (!(i + 4 == in.size() && pad >= 1)) out->push_back(static_cast<char>(v & 0xFF));
  }
  // Non-canonical padding bits (e.g. "QR==") would alias another token: reject.
  if (pad > 0) {
    const int8_t last = kBase64[static_cast<uint8_t>(in[in.size() - pad - 1])];
    if ((pad == 2 && (last & 0x0F)) || (pad == 1 && (last & 0x03))) return false;
  }
  return true;
}

// Inverse of GPT-2's bytes_to_unicode(): code point -> byte, or -1.
std::array<int16_t, 324> make_byte_level_inverse() {
  std::array<int16_t, 324> inv{};
  inv.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[printable ? b : 256 + extra++] = static_cast<int16_t>(b);
  }
  return inv;
}

// Maps a byte-level string back to raw bytes; false if it is not one.
bool byte_level_to_raw(std::string_view s, std::string* out) {
  static const auto inv = make_byte_level_inverse();
  if (!utf8_is_valid(s)) return false;
  out->clear();
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const char32_t c = utf8_decode_valid(s.data() + i, &len);
    if (c >= inv.size() || inv[c] < 0) return false;
    out->push_back(static_cast<char>(inv[c]));
    i += len;
  }
  return true;
}

std::string where(std::string_view name, size_t line) {
  return std::string(name) + ":" + std::to_string(line) + ": ";
}

}  // namespace

uint64_t hash_bytes(const char* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = n * kMul;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8, n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

Result<Vocab> Vocab::load(const std::string& path, VocabFormat format) {
  auto file = MappedFile::open(path);
  if (!file) return file.error();
  const auto bytes = file->bytes();
  return parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path, format);
}

Result<Vocab> Vocab::parse(std::string_view text, std::string_view name, VocabFormat format) {
  struct Entry {
    std::string bytes;
    bool mergeable = true;
    size_t line = 0;
  };
  std::vector<Entry> by_rank;
  std::string decoded, raw;
  // Ranks must be contiguous, so none can reach the line count: bounding them here keeps a hostile
  // file from sizing `by_rank` (found by fuzz_tokenizer: one huge rank asked for 48 GB).
  const size_t max_rank = static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
      return corrupt(where(name, line_no) + "expected 'base64 rank'");
    }
    const std::string_view b64 = line.substr(0, sp), rank_text = line.substr(sp + 1);
    if (!base64_decode(b64, &decoded)) return corrupt(where(name, line_no) + "bad base64 token");
    if (decoded.empty()) return corrupt(where(name, line_no) + "empty token");
    uint32_t rank = 0;
    const auto [ptr, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || ptr != rank_text.data() + rank_text.size() || rank >= (1u << 30)) {
      return corrupt(where(name, line_no) + "bad rank '" + std::string(rank_text) + "'");
    }
    if (rank >= max_rank) {
      return corrupt(where(name, line_no) + "rank " + std::to_string(rank) + " exceeds the number of lines (" +
                     std::to_string(max_rank) + "); ranks must be contiguous from 0");
    }
    if (rank >= by_rank.size()) by_rank.resize(rank + 1);
    Entry& e = by_rank[rank];
    if (e.line != 0) {
      return corrupt(where(name, line_no) + "duplicate rank " + std::to_string(rank) + " (first on line " +
                     std::to_string(e.line) + ")");
    }
    e.line = line_no;
    if (format == VocabFormat::kGpt2ByteLevel && byte_level_to_raw(decoded, &raw)) {
      e.bytes = raw;
    } else {
      e.bytes = decoded;
      e.mergeable = format == VocabFormat::kRawBytes;
    }
  }
  if (by_rank.empty()) return corrupt(std::string(name) + ": no tokens");
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (by_rank[r].line == 0) {
      return corrupt(std::string(name) + ": ranks are not contiguous: rank " + std::to_string(r) +
                     " is missing (max rank " + std::to_string(by_rank.size() - 1) + ")");
    }
  }
  Vocab v;
  v.offsets_.reserve(by_rank.size() + 1);
  v.mergeable_.reserve(by_rank.size());
  for (const Entry& e : by_rank) {
    v.offsets_.push_back(static_cast<uint32_t>(v.arena_.size()));
    v.arena_ += e.bytes;
    v.mergeable_.push_back(e.mergeable ? 1 : 0);
  }
  v.offsets_.push_back(static_cast<uint32_t>(v.arena_.size()));
  v.build_index();
  // Duplicate token bytes would make ranks ambiguous: report the second occurrence.
  for (int32_t id = 0; id < v.size(); ++id) {
    if (!v.mergeable(id)) continue;
    const int32_t found = v.rank(v.bytes(id));
    if (found != id) {
      return corrupt(where(name, by_rank[id].line) + "duplicate token (same bytes as rank " +
                     std::to_string(found) + ")");
    }
  }
  return v;
}

void Vocab::build_index() {
  size_t cap = 1;
  while (cap < static_cast<size_t>(size()) * 2 + 2) cap <<= 1;
  slots_.assign(cap, 0);
  short_ranks_.assign(256 + 65536, -1);
  mask_ = cap - 1;
  for (int32_t id = 0; id < size(); ++id) {
    if (!mergeable(id)) continue;
    const std::string_view b = bytes(id);
    if (b.size() <= 2) {
      const size_t k = b.size() == 1 ? static_cast<uint8_t>(b[0])
                                     : 256 + (static_cast<uint8_t>(b[0]) << 8 | static_cast<uint8_t>(b[1]));
      if (short_ranks_[k] < 0) short_ranks_[k] = id;
      continue;
    }
    const uint64_t h = hash_bytes(b.data(), b.size());
    const uint64_t entry = (h & 0xFFFFFFFF00000000ull) | (static_cast<uint64_t>(id) + 1);
    for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
      if (slots_[s] == 0) {
        slots_[s] = entry;
        break;
      }
      if (bytes(static_cast<int32_t>((slots_[s] & 0xFFFFFFFF) - 1)) == b) break;  // duplicate: parse() reports
    }
  }
}

int32_t Vocab::rank_long(const char* p, size_t n) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(p, n);
  const uint64_t tag = h & 0xFFFFFFFF00000000ull;
  for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
    const uint64_t v = slots_[s];
    if (v == 0) return -1;
    if ((v & 0xFFFFFFFF00000000ull) != tag) continue;
    const int32_t id = static_cast<int32_t>((v & 0xFFFFFFFF) - 1);
    const uint32_t off = offsets_[id], len = offsets_[id + 1] - off;
    if (len == n && std::memcmp(arena_.data() + off, p, n) == 0) return id;
  }
}

}  // namespace kestrel::chat
