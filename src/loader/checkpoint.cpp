#include "loader/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kestrel {
namespace fs = std::filesystem;

namespace {

std::string dtypes_str(const std::vector<DType>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "|" : "") + std::string(dtype_name(d[i]));
  return s;
}

// Reads model.safetensors.index.json → shard file list and name → shard map.
Result<std::map<std::string, std::string>> read_index(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt(path + ": not valid JSON");
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) return corrupt(path + ": missing weight_map");
  std::map<std::string, std::string> m;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) return corrupt(path + ": weight_map['" + it.key() + "'] is not a string");
    const std::string f = it.value().get<std::string>();
    if (f.find('/') != std::string::npos || f == ".." || f.empty())
      return corrupt(path + ": weight_map['" + it.key() + "'] names a file outside the checkpoint: " + f);
    m[it.key()] = f;
  }
  return m;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index)) {
    auto m = read_index(index.string());
    if (!m) return m.error();
    weight_map = std::move(*m);
    std::set<std::string> uniq;
    for (const auto& [name, f] : weight_map) uniq.insert(f);
    shard_names.assign(uniq.begin(), uniq.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    return not_found(dir + ": no model.safetensors.index.json or model.safetensors");
  }
  for (const auto& s : shard_names) {
    auto f = SafetensorsFile::open((fs::path(dir) / s).string());
    if (!f) return f.error();
    c.files_.push_back(std::make_unique<SafetensorsFile>(std::move(*f)));
    const size_t fi = c.files_.size() - 1;
    for (const auto& e : c.files_[fi]->header().entries) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end())
          return corrupt(c.files_[fi]->path() + ": tensor '" + e.name + "' is not listed in the index");
        if (it->second != s)
          return corrupt(c.files_[fi]->path() + ": tensor '" + e.name + "' is indexed in " + it->second);
      }
      if (!c.tensors_.emplace(e.name, Loc{fi, &e}).second)
        return corrupt(c.files_[fi]->path() + ": tensor '" + e.name + "' appears in more than one shard");
    }
  }
  for (const auto& [name, f] : weight_map)
    if (!c.tensors_.count(name))
      return corrupt((fs::path(dir) / f).string() + ": tensor '" + name + "' listed in the index is missing");
  return c;
}

Status Checkpoint::expect(const std::string& name, const std::vector<DType>& dtypes,
                          const std::vector<int64_t>& shape) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found(dir_ + ": missing tensor '" + name + "'");
  const SafetensorsFile& f = *files_[it->second.file];
  const SafetensorsEntry& e = *it->second.entry;
  if (!dtypes.empty() && std::find(dtypes.begin(), dtypes.end(), e.dtype) == dtypes.end())
    return corrupt(f.path() + ": tensor '" + name + "' has dtype " + std::string(dtype_name(e.dtype)) +
                   ", expected " + dtypes_str(dtypes));
  if (!shape.empty() && e.shape != shape)
    return corrupt(f.path() + ": tensor '" + name + "' has shape " + shape_str(e.shape) + ", expected " +
                   shape_str(shape));
  if (used_.insert(name).second && progress_) {
    progress_->advance(e.end - e.begin);
    if (used_.size() == tensors_.size()) progress_.reset();
  }
  return Status::ok();
}

Result<TensorView> Checkpoint::get(const std::string& name, const std::vector<DType>& dtypes,
                                   const std::vector<int64_t>& shape) {
  return get_part(name, dtypes, shape, UINT64_MAX);
}

Result<TensorView> Checkpoint::get_part(const std::string& name, const std::vector<DType>& dtypes,
                                        const std::vector<int64_t>& shape, uint64_t counted) {
  KESTREL_RETURN_IF_ERROR(expect(name, dtypes, shape));
  const auto it = tensors_.find(name);
  const SafetensorsFile& f = *files_[it->second.file];
  const SafetensorsEntry& e = *it->second.entry;
  TensorView v = f.view(e);
  if (fetched_.insert(name).second) bound_bytes_ += std::min<uint64_t>(counted, e.end - e.begin);
  const auto align = static_cast<uintptr_t>(dtype_size(e.dtype));
  if (reinterpret_cast<uintptr_t>(v.data) % align != 0) {
    const size_t bytes = static_cast<size_t>(v.nbytes());
    aligned_copies_.push_back(std::unique_ptr<uint64_t[]>(new uint64_t[(bytes + 7) / 8]));
    std::memcpy(aligned_copies_.back().get(), v.data, bytes);
    v.data = aligned_copies_.back().get();
  }
  return v;
}

void Checkpoint::show_progress(const std::string& label) {
  uint64_t bytes = 0;
  for (const auto& [name, loc] : tensors_) bytes += loc.entry->end - loc.entry->begin;
  progress_ = std::make_unique<Progress>(label, bytes, tensors_.size());
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, loc] : tensors_)
    if (!used_.count(name)) out.push_back(name);
  return out;
}

uint64_t Checkpoint::tensor_bytes(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? 0 : it->second.entry->end - it->second.entry->begin;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? dir_ : files_[it->second.file]->path();
}

}  // namespace kestrel
