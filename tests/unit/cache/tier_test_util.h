// Helpers shared by the lower-tier tests: a scratch directory and recognisable keys and payloads.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/block_hash.h"

namespace kestrel::tiertest {

// A fresh directory under /tmp, removed with everything in it at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/kestrel-tier-XXXXXX";
    path_ = ::mkdtemp(tmpl) ? tmpl : "";
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline Digest key_of(uint32_t n) {
  Digest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>((n >> (8 * (i % 4))) + i * 13);
  return d;
}

inline std::vector<uint8_t> bytes_of(uint32_t n, size_t size) {
  std::vector<uint8_t> b(size);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<uint8_t>(n * 131 + i * 7);
  return b;
}

// Regular files anywhere under `dir` (recursively).
inline int count_files(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file()) ++n;
  return n;
}

}  // namespace kestrel::tiertest
