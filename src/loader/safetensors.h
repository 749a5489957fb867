// safetensors parsing (untrusted bytes: every field validated before use) and a small writer.
// Format: u64 little-endian header length N | N bytes of JSON | data. JSON maps tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} relative to the data section; "__metadata__" is
// an optional string map.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/result.h"
#include "tensor/tensor.h"

namespace kestrel {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset inside the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by begin
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // absolute file offset of the data section
};

// Validates header length vs file size, JSON syntax and schema, known dtypes, shape x dtype == byte
// span, offsets inside the data section, no overlaps. `label` names the file in error messages.
Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, std::string_view label);

// A memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  TensorView view(const SafetensorsEntry& e) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// One tensor to write: bytes must hold numel(shape) * dtype_size(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace kestrel
