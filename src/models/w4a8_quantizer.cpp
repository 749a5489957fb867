#include "models/w4a8_quantizer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kernels/cpu/w4a8_format.h"
#include "loader/checkpoint.h"
#include "loader/safetensors.h"

namespace kestrel {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A compressed-tensors target for a module name: regex-escaped, numeric path components (layer and
// expert indices) generalised, so one entry covers every layer / expert.
std::string module_pattern(const std::string& module) {
  std::string out = "re:";
  size_t start = 0;
  for (size_t part = 0; start <= module.size(); ++part) {
    const size_t dot = std::min(module.find('.', start), module.size());
    const std::string c = module.substr(start, dot - start);
    if (part > 0) out += "\\.";
    const bool index = part > 0 && !c.empty() && c.find_first_not_of("0123456789") == std::string::npos;
    if (index) {
      out += "\\d+";
    } else {
      for (char ch : c) {
        if (std::string(".[]()*+?^$|\\{}").find(ch) != std::string::npos) out += '\\';
        out += ch;
      }
    }
    start = dot + 1;
  }
  return out + "$";
}

std::vector<uint8_t> to_bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// int4 pack-quantized tensors of one weight [out, in].
void quantize_weight(const std::string& module, const TensorView& w, int64_t G, std::vector<TensorToWrite>& dst) {
  const int64_t out = w.shape[0], in = w.shape[1];
  TensorToWrite packed{module + ".weight_packed", DType::kI32, {out, in / 8}, std::vector<uint8_t>(static_cast<size_t>(out * in / 2))};
  TensorToWrite scale{module + ".weight_scale", DType::kBF16, {out, in / G}, std::vector<uint8_t>(static_cast<size_t>(out * (in / G) * 2))};
  const int64_t dims[2] = {out, in};
  TensorToWrite shape{module + ".weight_shape", DType::kI64, {2}, to_bytes(dims, sizeof dims)};
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(in));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < out; ++r) {
      to_f32(w, r * in, in, row.data());
      kernels::quantize_int4_row(row.data(), in, G, reinterpret_cast<uint32_t*>(packed.bytes.data()) + r * (in / 8),
                                 reinterpret_cast<uint16_t*>(scale.bytes.data()) + r * (in / G));
    }
  }
  dst.push_back(std::move(packed));
  dst.push_back(std::move(scale));
  dst.push_back(std::move(shape));
}

Result<json> read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt(path + ": not a valid JSON object");
  return j;
}

json patterns_json(const std::set<std::string>& modules) {
  std::set<std::string> p;
  for (const auto& m : modules) p.insert(module_pattern(m));
  return json(std::vector<std::string>(p.begin(), p.end()));
}

// quantization_config for what was written: int4 W4A8 group (+ the MXFP4 group kept from the input).
json quant_config(const QuantizeOptions& opt, const std::set<std::string>& int4, const std::set<std::string>& mxfp4,
                  const std::set<std::string>& kept_linear, const json& old_mxfp4_weights) {
  json groups = json::object();
  if (!mxfp4.empty()) {
    json w = old_mxfp4_weights.is_object() ? old_mxfp4_weights
                                           : json{{"num_bits", 4}, {"type", "float"}, {"group_size", 32},
                                                  {"strategy", "group"}, {"symmetric", true}, {"scale_dtype", "torch.uint8"}};
    groups["group_0"] = {{"format", "mxfp4-pack-quantized"}, {"targets", patterns_json(mxfp4)}, {"weights", w},
                         {"input_activations", nullptr}, {"output_activations", nullptr}};
  }
  groups[mxfp4.empty() ? "group_0" : "group_1"] = {
      {"format", "pack-quantized"},
      {"targets", patterns_json(int4)},
      {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"},
                   {"group_size", opt.group_size}, {"dynamic", false}, {"observer", "minmax"}, {"actorder", nullptr}}},
      {"input_activations", {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "token"},
                             {"dynamic", true}, {"observer", nullptr}}},
      {"output_activations", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", mxfp4.empty() ? "pack-quantized" : "mixed-precision"},
          {"quantization_status", "compressed"},
          {"config_groups", groups},
          {"ignore", patterns_json(kept_linear)},
          {"kv_cache_scheme", nullptr}};
}

}  // namespace

bool is_w4a8_target(const std::string& name, const std::vector<int64_t>& shape, const QuantizeOptions& opt) {
  if (!ends_with(name, ".weight") || shape.size() != 2 || shape[1] % opt.group_size != 0) return false;
  if (name.find("embed_tokens") != std::string::npos) return false;
  if (ends_with(name, "lm_head.weight")) return opt.quantize_lm_head;
  if (ends_with(name, ".gate.weight") || ends_with(name, "_res_proj.weight")) return false;  // router, AttnRes
  return name.find("vision_tower") == std::string::npos && name.find("mm_projector") == std::string::npos;
}

Result<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& opt, const QuantizeProgress& progress) {
  if (opt.group_size != 32 && opt.group_size != 64 && opt.group_size != 128)
    return invalid_argument("--group-size must be 32, 64 or 128");
  if (fs::exists(opt.out_dir) && fs::equivalent(opt.in_dir, opt.out_dir))
    return invalid_argument("--out must differ from --model");
  auto cfg = read_json((fs::path(opt.in_dir) / "config.json").string());
  if (!cfg) return cfg.error();
  auto ck = Checkpoint::open(opt.in_dir);
  if (!ck) return ck.error();
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) return io_error(opt.out_dir + ": cannot create: " + ec.message());

  // Input shard → its tensors (names sorted), so the output mirrors the input's sharding.
  std::map<std::string, std::vector<std::string>> shards;
  const auto names = ck->names();
  for (const auto& n : names) shards[fs::path(ck->file_of(n)).filename().string()].push_back(n);
  QuantizeSummary sum;
  std::set<std::string> int4, mxfp4, kept_linear;
  json weight_map = json::object();
  size_t done = 0;
  for (const auto& [shard, members] : shards) {
    std::vector<TensorToWrite> out;
    for (const auto& n : members) {
      auto t = ck->get(n, {}, {});
      if (!t) return t.error();
      sum.bytes_in += static_cast<uint64_t>(t->nbytes());
      const bool is_float = t->dtype == DType::kBF16 || t->dtype == DType::kF16 || t->dtype == DType::kF32;
      if (ends_with(n, ".weight_packed")) {
        if (t->dtype != DType::kU8)
          return unsupported(ck->file_of(n) + ": tensor '" + n + "' is already int4 pack-quantized");
        mxfp4.insert(n.substr(0, n.size() - 14));
        ++sum.kept_mxfp4;
        out.push_back({n, t->dtype, t->shape, to_bytes(t->data, static_cast<size_t>(t->nbytes()))});
      } else if (is_float && is_w4a8_target(n, t->shape, opt)) {
        const std::string module = n.substr(0, n.size() - 7);
        quantize_weight(module, *t, opt.group_size, out);
        int4.insert(module);
        ++sum.quantized;
      } else {
        if (ends_with(n, ".weight") && t->shape.size() == 2 && n.find("embed_tokens") == std::string::npos &&
            !ends_with(n, "_res_proj.weight"))
          kept_linear.insert(n.substr(0, n.size() - 7));
        ++sum.copied;
        out.push_back({n, t->dtype, t->shape, to_bytes(t->data, static_cast<size_t>(t->nbytes()))});
      }
      if (progress) progress(++done, names.size(), n);
    }
    for (const auto& t : out) {
      weight_map[t.name] = shard;
      sum.bytes_out += t.bytes.size();
    }
    KESTREL_RETURN_IF_ERROR(write_safetensors((fs::path(opt.out_dir) / shard).string(), out, {{"format", "pt"}}));
  }
  if (int4.empty()) return invalid_argument(opt.in_dir + ": no bf16 linear weight to quantize");

  json index = {{"metadata", {{"total_size", sum.bytes_out}}}, {"weight_map", weight_map}};
  std::ofstream(fs::path(opt.out_dir) / "model.safetensors.index.json") << index.dump(2) << "\n";
  // The quantization block goes where the release keeps it: K3 inside text_config, else top level.
  json& c = *cfg;
  json& node = c.contains("text_config") && c["text_config"].is_object() ? c["text_config"] : c;
  json old_mx;
  for (json* q : {&c, &node}) {
    if (q->contains("quantization_config")) {
      const json& oq = (*q)["quantization_config"];
      if (oq.is_object() && oq.contains("config_groups") && oq["config_groups"].is_object())
        for (const auto& [k, g] : oq["config_groups"].items())
          if (g.is_object() && g.contains("weights") && g["weights"].is_object() && g["weights"].contains("type") &&
              g["weights"]["type"] == "float")
            old_mx = g["weights"];  // the release's MXFP4 group, kept verbatim
      q->erase("quantization_config");
    }
  }
  node["quantization_config"] = quant_config(opt, int4, mxfp4, kept_linear, old_mx);
  std::ofstream(fs::path(opt.out_dir) / "config.json") << c.dump(2) << "\n";
  // Tokenizer and other side files travel along.
  for (const auto& e : fs::directory_iterator(opt.in_dir)) {
    const std::string f = e.path().filename().string();
    if (!e.is_regular_file() || ends_with(f, ".safetensors") || f == "model.safetensors.index.json" || f == "config.json")
      continue;
    fs::copy_file(e.path(), fs::path(opt.out_dir) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error((fs::path(opt.out_dir) / f).string() + ": cannot copy: " + ec.message());
  }
  if (!fs::exists(fs::path(opt.out_dir) / "model.safetensors.index.json")) return io_error(opt.out_dir + ": write failed");
  return sum;
}

}  // namespace kestrel
