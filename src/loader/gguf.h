// GGUF (v2 and v3) parsing: untrusted bytes, every field validated before use.
// Layout (little-endian): "GGUF" | u32 version | u64 n_tensors | u64 n_kv | n_kv × (string key, u32 type,
// value) | n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset) | padding to
// general.alignment (default 32) | data. Strings are u64 length + bytes (no NUL). ne[0] is the fastest
// dimension (ggml order); `shape()` gives the row-major (numpy) order. Tensor offsets are relative to
// the data section, multiples of the alignment, and tensors may not overlap.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/result.h"

namespace kestrel {

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9,
  kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars hold one element; arrays hold `n` elements of `elem` (arrays of arrays
// are kept in `nested`). Numeric elements are stored as raw 64-bit patterns in `raw` (sign-extended
// for signed types, IEEE bits for floats) and read through the typed accessors.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType elem = GgufType::kU8;  // arrays only
  std::vector<uint64_t> raw;       // numeric / bool elements
  std::vector<std::string> str;    // string elements
  std::vector<GgufValue> nested;   // array elements that are arrays

  bool is_array() const { return type == GgufType::kArray; }
  GgufType elem_type() const { return is_array() ? elem : type; }
  size_t size() const;
  // Integer / bool element i (any integer type; floats and strings give nullopt).
  std::optional<int64_t> as_int(size_t i = 0) const;
  // Any numeric element as double.
  std::optional<double> as_double(size_t i = 0) const;
  std::optional<std::string> as_string(size_t i = 0) const;
};

// ggml tensor element types (values as in ggml.h). Only the ones in the size table are accepted.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9, kQ2_K = 10,
  kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18,
  kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26,
  kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39, kNVFP4 = 40,
  kQ1_0 = 41, kQ2_0 = 42,
};
struct GgmlTypeTraits {
  std::string_view name;
  int64_t block = 0;       // elements per block (along ne[0])
  int64_t block_bytes = 0;
};
// nullopt for a type id this parser does not know.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] fastest; 1..4 dims
  uint64_t offset = 0;      // relative to the data section
  uint64_t nbytes = 0;
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }  // row-major order
  int64_t numel() const;
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_start = 0;                     // absolute file offset of the data section
  std::map<std::string, GgufValue> kv;
  std::vector<GgufTensorInfo> tensors;          // file order
  const GgufValue* find(const std::string& key) const;
  const GgufTensorInfo* tensor(const std::string& name) const;
};

// Validates magic and version (2 or 3), counts against the file size, string lengths, value types,
// dims (1..4, positive, no overflow, ne[0] a multiple of the block size), known ggml types, offsets
// aligned and inside the file, and no two tensors overlapping. `label` names the file in errors.
Result<GgufHeader> parse_gguf(std::span<const uint8_t> file, std::string_view label);

// A memory-mapped, validated GGUF file. Tensor bytes are views into the map (zero-copy).
class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);
  const std::string& path() const { return file_.path(); }
  const GgufHeader& header() const { return header_; }
  const uint8_t* data(const GgufTensorInfo& t) const { return file_.bytes().data() + header_.data_start + t.offset; }
  // Bytes of the map that were copied out: their pages leave memory until read again (MappedFile::drop_pages).
  void drop_pages(const uint8_t* p, size_t n) const { file_.drop_pages(p, n); }

 private:
  MappedFile file_;
  GgufHeader header_;
};

}  // namespace kestrel
