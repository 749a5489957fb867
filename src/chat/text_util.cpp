#include "chat/text_util.h"

#include <cstdint>

namespace kestrel::chat {

namespace {

bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

bool is_py_whitespace_only(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b = s[i];
    uint32_t cp;
    size_t len;
    if (b < 0x80) cp = b, len = 1;
    else if ((b & 0xE0) == 0xC0) cp = b & 0x1F, len = 2;
    else if ((b & 0xF0) == 0xE0) cp = b & 0x0F, len = 3;
    else if ((b & 0xF8) == 0xF0) cp = b & 0x07, len = 4;
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    }
    if (!py_isspace(cp)) return false;
    i += len;
  }
  return true;
}

}  // namespace kestrel::chat
