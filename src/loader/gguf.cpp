#include "loader/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace kestrel {
namespace {

constexpr int kMaxArrayDepth = 4;          // arrays of arrays of ...; bounds recursion
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr uint64_t kMaxAlignment = 1ull << 20;

struct TypeRow {
  uint32_t id;
  GgmlTypeTraits traits;
};
// Block geometry as in ggml's type_traits (and gguf-py's GGML_QUANT_SIZES).
constexpr TypeRow kTypes[] = {
    {0, {"F32", 1, 4}},        {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},     {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},     {7, {"Q5_1", 32, 24}},     {8, {"Q8_0", 32, 34}},     {9, {"Q8_1", 32, 36}},
    {10, {"Q2_K", 256, 84}},   {11, {"Q3_K", 256, 110}},  {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},  {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}}, {17, {"IQ2_XS", 256, 74}},
    {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}}, {20, {"IQ4_NL", 32, 18}},  {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}},  {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},        {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},       {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},       {29, {"IQ1_M", 256, 56}},
    {30, {"BF16", 1, 2}},      {34, {"TQ1_0", 256, 54}},  {35, {"TQ2_0", 256, 66}},  {39, {"MXFP4", 32, 17}},
    {40, {"NVFP4", 64, 36}},   {41, {"Q1_0", 128, 18}},   {42, {"Q2_0", 64, 18}},
};

// Bounds-checked little-endian cursor over the file; every read fails (returns false) past the end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }
  template <typename T>
  bool read(T& v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));  // host is little-endian (x86-64 / aarch64)
    pos_ += sizeof(T);
    return true;
  }
  bool read_string(std::string& s) {
    uint64_t n = 0;
    if (!read(n) || n > left() || n > kMaxStringBytes) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(n));
    pos_ += n;
    return true;
  }

 private:
  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

int64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Reads one numeric element of type t as a raw 64-bit pattern (signed types sign-extended).
bool read_numeric(Reader& r, GgufType t, uint64_t& out) {
  switch (t) {
    case GgufType::kU8: { uint8_t v; if (!r.read(v)) return false; out = v; return true; }
    case GgufType::kI8: { int8_t v; if (!r.read(v)) return false; out = static_cast<uint64_t>(static_cast<int64_t>(v)); return true; }
    case GgufType::kBool: { uint8_t v; if (!r.read(v) || v > 1) return false; out = v; return true; }
    case GgufType::kU16: { uint16_t v; if (!r.read(v)) return false; out = v; return true; }
    case GgufType::kI16: { int16_t v; if (!r.read(v)) return false; out = static_cast<uint64_t>(static_cast<int64_t>(v)); return true; }
    case GgufType::kU32: { uint32_t v; if (!r.read(v)) return false; out = v; return true; }
    case GgufType::kI32: { int32_t v; if (!r.read(v)) return false; out = static_cast<uint64_t>(static_cast<int64_t>(v)); return true; }
    case GgufType::kF32: { uint32_t v; if (!r.read(v)) return false; out = v; return true; }
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return r.read(out);
    default: return false;
  }
}

// Reads a value of type t; `err` gets a short reason on failure.
bool read_value(Reader& r, GgufType t, GgufValue& v, int depth, std::string& err) {
  v.type = t;
  if (t == GgufType::kString) {
    v.str.emplace_back();
    if (!r.read_string(v.str.back())) return err = "string runs past end of file", false;
    return true;
  }
  if (t != GgufType::kArray) {
    v.raw.emplace_back();
    if (!read_numeric(r, t, v.raw.back()))
      return err = t == GgufType::kBool ? "bad bool (not 0/1) or truncated" : "value runs past end of file", false;
    return true;
  }
  if (depth >= kMaxArrayDepth) return err = "arrays nested deeper than " + std::to_string(kMaxArrayDepth), false;
  uint32_t et = 0;
  uint64_t n = 0;
  if (!r.read(et) || !r.read(n)) return err = "array header runs past end of file", false;
  if (!known_value_type(et)) return err = "unknown array element type " + std::to_string(et), false;
  v.elem = static_cast<GgufType>(et);
  // Every element takes at least one byte (strings 8, arrays 12): bounds the count before reserving.
  const int64_t min_elem = v.elem == GgufType::kString ? 8 : v.elem == GgufType::kArray ? 12 : scalar_size(v.elem);
  if (n > r.left() / static_cast<uint64_t>(min_elem))
    return err = "array of " + std::to_string(n) + " elements larger than the file", false;
  if (v.elem == GgufType::kString) {
    v.str.resize(static_cast<size_t>(n));
    for (auto& s : v.str)
      if (!r.read_string(s)) return err = "array string runs past end of file", false;
  } else if (v.elem == GgufType::kArray) {
    v.nested.resize(static_cast<size_t>(n));
    for (auto& e : v.nested)
      if (!read_value(r, GgufType::kArray, e, depth + 1, err)) return false;
  } else {
    v.raw.resize(static_cast<size_t>(n));
    for (auto& e : v.raw)
      if (!read_numeric(r, v.elem, e)) return err = "bad array element (truncated or bool not 0/1)", false;
  }
  return true;
}

bool is_integer(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kI8 || t == GgufType::kU16 || t == GgufType::kI16 ||
         t == GgufType::kU32 || t == GgufType::kI32 || t == GgufType::kU64 || t == GgufType::kI64 ||
         t == GgufType::kBool;
}

Status gguf_error(std::string_view label, const std::string& what) { return corrupt(std::string(label) + ": " + what); }

Result<GgufTensorInfo> read_tensor_info(Reader& r, std::string_view label, uint64_t index) {
  GgufTensorInfo t;
  auto err = [&](const std::string& what) {
    return gguf_error(label, "tensor " + (t.name.empty() ? "#" + std::to_string(index) : "'" + t.name + "'") + ": " + what);
  };
  if (!r.read_string(t.name)) return err("name runs past end of file");
  uint32_t nd = 0;
  if (!r.read(nd)) return err("truncated tensor info");
  if (nd < 1 || nd > 4) return err("n_dims " + std::to_string(nd) + " outside 1..4");
  uint64_t numel = 1;
  for (uint32_t i = 0; i < nd; ++i) {
    uint64_t d = 0;
    if (!r.read(d)) return err("truncated dims");
    if (d == 0 || d > (1ull << 40)) return err("dim " + std::to_string(i) + " = " + std::to_string(d) + " out of range");
    if (numel > (std::numeric_limits<uint64_t>::max() >> 8) / d) return err("element count overflows");
    numel *= d;
    t.ne.push_back(static_cast<int64_t>(d));
  }
  uint32_t type = 0;
  if (!r.read(type) || !r.read(t.offset)) return err("truncated tensor info");
  const auto tr = ggml_type_traits(type);
  if (!tr) return err("unknown ggml type " + std::to_string(type));
  t.type = static_cast<GgmlType>(type);
  if (t.ne[0] % tr->block != 0)
    return err("ne[0] = " + std::to_string(t.ne[0]) + " not a multiple of the " + std::string(tr->name) +
               " block size " + std::to_string(tr->block));
  t.nbytes = numel / static_cast<uint64_t>(tr->block) * static_cast<uint64_t>(tr->block_bytes);
  return t;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

size_t GgufValue::size() const {
  if (!is_array()) return 1;
  return elem == GgufType::kString ? str.size() : elem == GgufType::kArray ? nested.size() : raw.size();
}

std::optional<int64_t> GgufValue::as_int(size_t i) const {
  const GgufType t = elem_type();
  if (!is_integer(t) || i >= raw.size()) return std::nullopt;
  if (t == GgufType::kU64 && raw[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(raw[i]);
}

std::optional<double> GgufValue::as_double(size_t i) const {
  const GgufType t = elem_type();
  if (i >= raw.size()) return std::nullopt;
  if (t == GgufType::kF32) return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(raw[i])));
  if (t == GgufType::kF64) return std::bit_cast<double>(raw[i]);
  if (t == GgufType::kU64) return static_cast<double>(raw[i]);
  if (is_integer(t)) return static_cast<double>(static_cast<int64_t>(raw[i]));
  return std::nullopt;
}

std::optional<std::string> GgufValue::as_string(size_t i) const {
  if (elem_type() != GgufType::kString || i >= str.size()) return std::nullopt;
  return str[i];
}

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  for (const TypeRow& r : kTypes)
    if (r.id == type) return r.traits;
  return std::nullopt;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

const GgufValue* GgufHeader::find(const std::string& key) const {
  auto it = kv.find(key);
  return it == kv.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufHeader::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<GgufHeader> parse_gguf(std::span<const uint8_t> file, std::string_view label) {
  Reader r(file);
  uint32_t magic = 0;
  GgufHeader h;
  uint64_t n_tensors = 0, n_kv = 0;
  if (!r.read(magic) || std::memcmp(&magic, "GGUF", 4) != 0) return gguf_error(label, "not a GGUF file (bad magic)");
  if (!r.read(h.version)) return gguf_error(label, "truncated header");
  if (h.version != 2 && h.version != 3)
    return gguf_error(label, "unsupported GGUF version " + std::to_string(h.version) + " (2 and 3 are)");
  if (!r.read(n_tensors) || !r.read(n_kv)) return gguf_error(label, "truncated header");
  // Minimum encoded sizes: a KV is key (8) + type (4) + 1 byte; a tensor info is name (8) + n_dims (4)
  // + one dim (8) + type (4) + offset (8).
  if (n_kv > r.left() / 13) return gguf_error(label, "metadata count " + std::to_string(n_kv) + " larger than the file");
  if (n_tensors > r.left() / 32)
    return gguf_error(label, "tensor count " + std::to_string(n_tensors) + " larger than the file");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    if (!r.read_string(key)) return gguf_error(label, "metadata key #" + std::to_string(i) + " runs past end of file");
    uint32_t t = 0;
    if (!r.read(t)) return gguf_error(label, "key '" + key + "': truncated type");
    if (!known_value_type(t)) return gguf_error(label, "key '" + key + "': unknown value type " + std::to_string(t));
    GgufValue v;
    std::string err;
    if (!read_value(r, static_cast<GgufType>(t), v, 0, err)) return gguf_error(label, "key '" + key + "': " + err);
    if (!h.kv.emplace(key, std::move(v)).second) return gguf_error(label, "duplicate key '" + key + "'");
  }
  if (const GgufValue* a = h.find("general.alignment")) {
    const auto v = a->is_array() ? std::nullopt : a->as_int();
    if (!v || *v <= 0 || static_cast<uint64_t>(*v) > kMaxAlignment || !std::has_single_bit(static_cast<uint64_t>(*v)))
      return gguf_error(label, "general.alignment must be a power of two in 1..2^20");
    h.alignment = static_cast<uint64_t>(*v);
  }
  h.tensors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    auto t = read_tensor_info(r, label, i);
    if (!t) return t.error();
    h.tensors.push_back(std::move(*t));
  }
  h.data_start = (r.pos() + h.alignment - 1) / h.alignment * h.alignment;
  if (h.data_start > file.size() && !h.tensors.empty())
    return gguf_error(label, "data section starts past end of file");
  const uint64_t data_size = file.size() >= h.data_start ? file.size() - h.data_start : 0;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : h.tensors) {
    auto err = [&](const std::string& what) { return gguf_error(label, "tensor '" + t.name + "': " + what); };
    if (t.offset % h.alignment != 0)
      return err("offset " + std::to_string(t.offset) + " not a multiple of the alignment " + std::to_string(h.alignment));
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      return err("data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                 ") runs past end of file (data section " + std::to_string(data_size) + " bytes)");
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->nbytes > by_offset[i]->offset)
      return gguf_error(label, "tensor '" + by_offset[i]->name + "' overlaps tensor '" + by_offset[i - 1]->name + "'");
  std::vector<std::string_view> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  for (size_t i = 1; i < names.size(); ++i)
    if (names[i] == names[i - 1]) return gguf_error(label, "duplicate tensor name '" + std::string(names[i]) + "'");
  return h;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  auto f = MappedFile::open(path);
  if (!f) return f.error();
  auto h = parse_gguf(f->bytes(), path);
  if (!h) return h.error();
  GgufFile g;
  g.file_ = std::move(*f);
  g.header_ = std::move(*h);
  return g;
}

}  // namespace kestrel
