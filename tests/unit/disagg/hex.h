// Hex text of byte strings: how the disagg tests pass worker addresses and packed rkeys to the peer process on its
// command line and read them back.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kestrel::disagg::testing {

inline std::string to_hex(const std::vector<std::byte>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s += d[static_cast<unsigned>(x) >> 4];
    s += d[static_cast<unsigned>(x) & 15];
  }
  return s;
}

inline std::vector<std::byte> from_hex(const std::string& s) {
  std::vector<std::byte> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoi(s.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace kestrel::disagg::testing
