// libFuzzer target: tiktoken vocabulary parser, encode / encode_bytes / decode, and the stream decoder.
// Input byte 0 picks the path; the rest is the payload. Invariants checked (abort = finding):
//   Vocab::parse never crashes; decode(encode_bytes(x)) == x; decode(encode(x)) == replace_invalid(x);
//   streamed output == replace_invalid(all token bytes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chat/stream_decoder.h"
#include "chat/tokenizer.h"
#include "chat/utf8.h"

namespace {

using namespace kestrel::chat;

std::string b64(std::string_view s) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    uint32_t v = uint8_t(s[i]) << 16;
    if (i + 1 < s.size()) v |= uint8_t(s[i + 1]) << 8;
    if (i + 2 < s.size()) v |= uint8_t(s[i + 2]);
    out += a[v >> 18 & 63], out += a[v >> 12 & 63];
    out += i + 1 < s.size() ? a[v >> 6 & 63] : '=';
    out += i + 2 < s.size() ? a[v & 63] : '=';
  }
  return out;
}

const Tokenizer& tokenizer(bool kimi) {
  static const Tokenizer* t[2] = {nullptr, nullptr};
  if (t[kimi] == nullptr) {
    std::string text;
    int rank = 0;
    for (int b = 0; b < 256; ++b) text += b64(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
    for (const char* m : {"ab", "abc", " a", "  ", "    ", "\xE4\xB8", "\xE4\xB8\xAD", "<|", "|>", "aa", "aaaa"}) {
      text += b64(m) + " " + std::to_string(rank++) + "\n";
    }
    auto v = Vocab::parse(text, "fuzz");
    auto pre = PreTokenizer::create(kimi ? Pattern::kKimi : Pattern::kCl100k);
    std::optional<ChunkCaps> caps;
    if (kimi) caps = ChunkCaps{64, 8};  // small caps so short inputs exercise the cuts
    auto tok = Tokenizer::create(std::move(*v), std::move(pre).value(), {{"<|open|>", 400}, {"<|o", 401}}, caps);
    if (!tok) abort();
    t[kimi] = new Tokenizer(std::move(*tok));
  }
  return *t[kimi];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t op = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  if (op % 4 == 0) {
    auto v = Vocab::parse(in, "fuzz", op & 4 ? VocabFormat::kGpt2ByteLevel : VocabFormat::kRawBytes);
    if (v) {
      for (int32_t id = 0; id < v->size(); ++id) {
        if (v->mergeable(id) && v->rank(v->bytes(id)) != id) abort();
      }
    }
    return 0;
  }
  const Tokenizer& t = tokenizer(op & 8);
  const SpecialMode mode = op & 16 ? SpecialMode::kAllow : SpecialMode::kAsText;
  if (op % 4 == 1) {
    if (*t.decode(t.encode_bytes(in, mode)) != in) abort();
  } else if (op % 4 == 2) {
    if (*t.decode(t.encode(in, mode)) != utf8_replace_invalid(in)) abort();
  } else {
    StreamDecoder d(t);
    std::string out, all;
    for (int32_t id : t.encode_bytes(in, mode)) {
      all += *t.token_bytes(id);
      out += *d.push(id);
    }
    if (out + d.flush() != utf8_replace_invalid(all)) abort();
  }
  return 0;
}
