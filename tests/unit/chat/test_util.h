// Helpers shared by the tokenizer unit tests.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include "base/check.h"
#include "chat/tokenizer.h"
#include "common/vocab_path.h"

namespace kestrel::chat::test {

inline std::string vocab_path(const std::string& name) { return kestrel::testing::vocab_file(name); }

// A base64 line for a token.
inline std::string b64(std::string_view s) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= s.size(); i += 3) {
    const uint32_t v = uint8_t(s[i]) << 16 | uint8_t(s[i + 1]) << 8 | uint8_t(s[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += a[(v >> k) & 63];
  }
  if (s.size() - i == 1) {
    const uint32_t v = uint8_t(s[i]) << 16;
    out += a[(v >> 18) & 63], out += a[(v >> 12) & 63], out += "==";
  } else if (s.size() - i == 2) {
    const uint32_t v = uint8_t(s[i]) << 16 | uint8_t(s[i + 1]) << 8;
    out += a[(v >> 18) & 63], out += a[(v >> 12) & 63], out += a[(v >> 6) & 63], out += '=';
  }
  return out;
}

// A toy vocabulary: the 256 single bytes (ranks 0..255) followed by `merges` (ranks 256..).
inline std::string toy_vocab_text(const std::vector<std::string>& merges) {
  std::string text;
  int rank = 0;
  for (int b = 0; b < 256; ++b) text += b64(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
  for (const auto& m : merges) text += b64(m) + " " + std::to_string(rank++) + "\n";
  return text;
}

}  // namespace kestrel::chat::test
