#include "loader/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace kestrel {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // same bound as the reference implementation

Status header_error(std::string_view label, const std::string& what) {
  return corrupt(std::string(label) + ": " + what);
}

Result<SafetensorsEntry> parse_entry(const std::string& name, const nlohmann::json& j, std::string_view label,
                                     uint64_t data_size) {
  auto err = [&](const std::string& what) { return header_error(label, "tensor '" + name + "': " + what); };
  if (!j.is_object()) return err("entry is not an object");
  if (!j.contains("dtype") || !j["dtype"].is_string()) return err("missing or non-string dtype");
  if (!j.contains("shape") || !j["shape"].is_array()) return err("missing or non-array shape");
  if (!j.contains("data_offsets") || !j["data_offsets"].is_array() || j["data_offsets"].size() != 2)
    return err("data_offsets must be [begin, end]");
  SafetensorsEntry e;
  e.name = name;
  auto dt = dtype_from_name(j["dtype"].get<std::string>());
  if (!dt) return err("unknown dtype '" + j["dtype"].get<std::string>() + "'");
  e.dtype = *dt;
  uint64_t numel = 1;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned()) return err("shape entries must be non-negative integers");
    const uint64_t v = d.get<uint64_t>();
    if (v > (1ull << 40) || (v != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / v))
      return err("shape too large");
    numel *= v;
    e.shape.push_back(static_cast<int64_t>(v));
  }
  for (const auto& o : j["data_offsets"])
    if (!o.is_number_unsigned()) return err("data_offsets must be non-negative integers");
  e.begin = j["data_offsets"][0].get<uint64_t>();
  e.end = j["data_offsets"][1].get<uint64_t>();
  if (e.end < e.begin) return err("data_offsets end < begin");
  if (e.end > data_size)
    return err("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
               ") past the end of the data section (" + std::to_string(data_size) + " bytes)");
  const uint64_t want = numel * static_cast<uint64_t>(dtype_size(e.dtype));
  if (e.end - e.begin != want)
    return err("byte span " + std::to_string(e.end - e.begin) + " != shape " + shape_str(e.shape) + " x " +
               std::string(dtype_name(e.dtype)) + " = " + std::to_string(want));
  return e;
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, std::string_view label) {
  if (file.size() < 8) return header_error(label, "file too short for a safetensors header (" +
                                                      std::to_string(file.size()) + " bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];
  if (n > kMaxHeaderBytes) return header_error(label, "header length " + std::to_string(n) + " exceeds 100 MiB");
  if (n > file.size() - 8)
    return header_error(label, "header length " + std::to_string(n) + " runs past end of file (" +
                                   std::to_string(file.size()) + " bytes)");
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  nlohmann::json j = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return header_error(label, "header is not valid JSON");
  if (!j.is_object()) return header_error(label, "header JSON is not an object");
  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = file.size() - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return header_error(label, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) return header_error(label, "__metadata__ values must be strings");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto e = parse_entry(it.key(), it.value(), label, data_size);
    if (!e) return e.error();
    h.entries.push_back(std::move(*e));
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < h.entries.size(); ++i) {
    const auto& prev = h.entries[i - 1];
    const auto& cur = h.entries[i];
    if (cur.begin < prev.end && cur.end > cur.begin && prev.end > prev.begin)
      return header_error(label, "tensor '" + cur.name + "' overlaps tensor '" + prev.name + "'");
  }
  return h;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = MappedFile::open(path);
  if (!f) return f.error();
  auto h = parse_safetensors(f->bytes(), path);
  if (!h) return h.error();
  SafetensorsFile s;
  s.file_ = std::move(*f);
  s.header_ = std::move(*h);
  return s;
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
  return TensorView{file_.bytes().data() + header_.data_start + e.begin, e.dtype, e.shape};
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (static_cast<uint64_t>(numel * dtype_size(t.dtype)) != t.bytes.size())
      return invalid_argument("write_safetensors: '" + t.name + "' byte size does not match its shape");
    j[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape},
                 {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = j.dump();
  while (header.size() % 8 != 0) header.push_back(' ');  // keep the data section 8-byte aligned
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return io_error(path + ": cannot create");
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& t : tensors)
    ok = ok && (t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size());
  ok = (std::fclose(f) == 0) && ok;
  return ok ? Status::ok() : io_error(path + ": write failed");
}

}  // namespace kestrel
