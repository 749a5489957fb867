// UTF-8 scanning helpers shared by the tokenizer and the streaming decoder.
// Validity follows Unicode Table 3-7 (no overlongs, no surrogates, max U+10FFFF). Invalid input is replaced
// "maximal subpart" by "maximal subpart" (Unicode §3.9, U+FFFD substitution), which is exactly what Python's
// bytes.decode("utf-8", errors="replace") does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kestrel::chat {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

struct Utf8Scan {
  size_t len = 0;           // bytes consumed: the sequence if valid, else the maximal subpart (>= 1)
  bool valid = false;       // a complete, well-formed sequence
  bool truncated = false;   // invalid only because the buffer ended: more bytes could complete it
};

// Scans the sequence starting at s[i] (requires i < s.size()).
Utf8Scan utf8_scan(std::string_view s, size_t i);

bool utf8_is_valid(std::string_view s);

// Returns s with every maximal invalid subpart replaced by U+FFFD.
std::string utf8_replace_invalid(std::string_view s);

// Decodes the well-formed sequence at p (caller guarantees validity); *len receives its byte length.
char32_t utf8_decode_valid(const char* p, size_t* len);

// Python's str.isspace(): bidi class WS/B/S or category Zs (Unicode 14). Used by the Kimi chunking caps,
// which are defined in Python code points.
bool is_python_space(char32_t c);

}  // namespace kestrel::chat
