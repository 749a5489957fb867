#include "chat/utf8.h"

namespace kestrel::chat {

namespace {

bool in(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

}  // namespace

Utf8Scan utf8_scan(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, true, false};
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  if (in(b0, 0xC2, 0xDF)) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if (in(b0, 0xE1, 0xEC) || in(b0, 0xEE, 0xEF)) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (in(b0, 0xF1, 0xF3)) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return {1, false, false};  // 80..C1, F5..FF never start a sequence
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) return {k, false, true};
    const auto b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? in(b, lo, hi) : in(b, 0x80, 0xBF);
    if (!ok) return {k, false, false};
  }
  return {need + 1, true, false};
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const Utf8Scan r = utf8_scan(s, i);
    if (!r.valid) return false;
    i += r.len;
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Scan r = utf8_scan(s, i);
    if (r.valid) {
      out.append(s.substr(i, r.len));
    } else {
      out.append(kReplacementChar);
    }
    i += r.len;
  }
  return out;
}

char32_t utf8_decode_valid(const char* p, size_t* len) {
  const auto b0 = static_cast<uint8_t>(p[0]);
  auto cont = [&](int k) { return static_cast<char32_t>(static_cast<uint8_t>(p[k]) & 0x3F); };
  if (b0 < 0x80) return *len = 1, b0;
  if (b0 < 0xE0) return *len = 2, ((b0 & 0x1F) << 6) | cont(1);
  if (b0 < 0xF0) return *len = 3, ((b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
  return *len = 4, ((b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

bool is_python_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace kestrel::chat
