// Test helpers: temporary directories, generated tiny checkpoints, safetensors header surgery.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/checkpoint_generator.h"

namespace kestrel::testing {

namespace fs = std::filesystem;

// A fresh directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kestrel-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// Generates a preset checkpoint (with optional spec edits) into dir.
inline void make_checkpoint(const std::string& preset, const std::string& dir,
                            const std::function<void(GenSpec&)>& edit = nullptr) {
  auto spec = gen_preset(preset);
  if (!spec) throw std::runtime_error(spec.error().message());
  if (edit) edit(*spec);
  Status s = generate_checkpoint(*spec, dir);
  if (!s.is_ok()) throw std::runtime_error(s.message());
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Rewrites the JSON header of a safetensors file (data section kept byte for byte).
inline void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  auto b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<size_t>(i)];
  nlohmann::json j = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<long>(n));
  edit(j);
  std::string h = j.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(h.size() >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), b.begin() + 8 + static_cast<long>(n), b.end());
  write_bytes(path, out);
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}
inline void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

// Shard file (basename) holding `tensor`, from the index.
inline std::string shard_of(const std::string& dir, const std::string& tensor) {
  return (fs::path(dir) / read_json((fs::path(dir) / "model.safetensors.index.json").string())["weight_map"][tensor]
                              .get<std::string>())
      .string();
}

}  // namespace kestrel::testing
