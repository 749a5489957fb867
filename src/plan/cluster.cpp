#include "plan/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

namespace kestrel::plan {
namespace {

using nlohmann::json;
constexpr double kG = 1e9, kT = 1e12;

// Datasheet figures, dense tensor-core throughput (half the "with sparsity" numbers), HBM in decimal
// GB as marketed, link bandwidth per GPU and direction. Approximate; override any field in the JSON.
struct PresetRow {
  const char* name;
  double hbm_gb, hbm_tb_s, bf16_tf, fp8_tf, nvlink_gb_s, network_gb_s;
  int domain, gpus_per_node;
  const char* source;
};
constexpr PresetRow kPresets[] = {
    {"h100", 80, 3.35, 989, 1979, 450, 50, 8, 8, "NVIDIA H100 SXM datasheet; NVLink4 900 GB/s bidir; 400 Gb/s NIC per GPU"},
    {"h200", 141, 4.8, 989, 1979, 450, 50, 8, 8, "NVIDIA H200 SXM datasheet; NVLink4 900 GB/s bidir; 400 Gb/s NIC per GPU"},
    {"b200", 180, 8.0, 2250, 4500, 900, 50, 8, 8, "NVIDIA HGX B200 datasheet (1.44 TB / 8); NVLink5 1.8 TB/s bidir; 400 Gb/s NIC"},
    {"b300", 288, 8.0, 2250, 4500, 900, 100, 8, 8, "NVIDIA HGX B300 datasheet (2.3 TB / 8); NVLink5 1.8 TB/s bidir; 800 Gb/s NIC"},
    {"gb200", 186, 8.0, 2500, 5000, 900, 50, 72, 4, "NVIDIA GB200 NVL72 datasheet (per GPU); 72-GPU NVLink domain"},
    {"gb300", 288, 8.0, 2500, 5000, 900, 100, 72, 4, "NVIDIA GB300 NVL72 datasheet (per GPU); 72-GPU NVLink domain"},
};

const PresetRow* find_preset(const std::string& name) {
  for (const PresetRow& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

Accelerator from_row(const PresetRow& p) {
  return {p.name, p.hbm_gb * kG, p.hbm_tb_s * kT, p.bf16_tf * kT, p.fp8_tf * kT, p.nvlink_gb_s * kG,
          p.network_gb_s * kG, p.domain, p.source};
}

// Reads one JSON object; the first error names the source and the dotted key path.
class Obj {
 public:
  Obj(const json& j, std::string path, const std::string& label) : j_(j), path_(std::move(path)), label_(label) {}
  Status check_keys(const std::set<std::string>& allowed) const {
    if (!j_.is_object()) return err("", "must be an object");
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!allowed.count(it.key())) return err(it.key(), "unknown key");
    return Status::ok();
  }
  bool has(const char* k) const { return j_.contains(k); }
  Status number(const char* k, double lo, double hi, double& out) const {
    if (!has(k)) return Status::ok();
    if (!j_[k].is_number()) return err(k, "must be a number");
    const double v = j_[k].get<double>();
    if (!std::isfinite(v) || v < lo || v > hi) return err(k, range(v, lo, hi));
    out = v;
    return Status::ok();
  }
  template <typename I>
  Status integer(const char* k, long long lo, long long hi, I& out) const {
    if (!has(k)) return Status::ok();
    if (!j_[k].is_number_integer()) return err(k, "must be an integer");
    const long long v = j_[k].get<long long>();
    if (v < lo || v > hi) return err(k, range(static_cast<double>(v), static_cast<double>(lo), static_cast<double>(hi)));
    out = static_cast<I>(v);
    return Status::ok();
  }
  Status choice(const char* k, const std::set<std::string>& allowed, std::string& out) const {
    if (!has(k)) return Status::ok();
    if (!j_[k].is_string() || !allowed.count(j_[k].get<std::string>())) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return err(k, "must be one of " + list);
    }
    out = j_[k].get<std::string>();
    return Status::ok();
  }
  Status err(const std::string& key, const std::string& what) const {
    const std::string p = key.empty() ? path_ : (path_.empty() ? key : path_ + "." + key);
    return invalid_argument(label_ + ": " + (p.empty() ? std::string("document") : "key '" + p + "'") + ": " + what);
  }

 private:
  static std::string range(double v, double lo, double hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%g is outside %g..%g", v, lo, hi);
    return buf;
  }
  const json& j_;
  std::string path_;
  const std::string& label_;
};

Status parse_accelerator(const json& j, const std::string& label, Accelerator& a, int& gpus_per_node) {
  if (j.is_string()) {
    const PresetRow* p = find_preset(j.get<std::string>());
    if (!p) return invalid_argument(label + ": key 'accelerator': unknown preset '" + j.get<std::string>() + "'");
    a = from_row(*p);
    gpus_per_node = p->gpus_per_node;
    return Status::ok();
  }
  Obj o(j, "accelerator", label);
  KESTREL_RETURN_IF_ERROR(o.check_keys({"preset", "name", "hbm_gb", "hbm_tb_s", "bf16_tflops", "fp8_tflops",
                                        "nvlink_gb_s", "network_gb_s", "nvlink_domain_gpus"}));
  std::string base;
  if (o.has("preset")) {
    std::set<std::string> names;
    for (const PresetRow& p : kPresets) names.insert(p.name);
    KESTREL_RETURN_IF_ERROR(o.choice("preset", names, base));
    a = from_row(*find_preset(base));
    gpus_per_node = find_preset(base)->gpus_per_node;
  } else {
    for (const char* k : {"hbm_gb", "hbm_tb_s", "bf16_tflops", "fp8_tflops"})
      if (!o.has(k)) return o.err(k, "missing required key (or give 'preset' to start from)");
    a = Accelerator{};
    a.name = "custom";
    a.source = label;
  }
  if (o.has("name")) {
    if (!j["name"].is_string()) return o.err("name", "must be a string");
    a.name = j["name"].get<std::string>();
  }
  double v = 0;
  struct Field {
    const char* key;
    double scale, lo, hi;
    double* out;
  };
  for (const Field& f : {Field{"hbm_gb", kG, 1, 1e5, &a.hbm_bytes}, Field{"hbm_tb_s", kT, 0.01, 1e3, &a.hbm_bw},
                         Field{"bf16_tflops", kT, 1, 1e6, &a.bf16_flops}, Field{"fp8_tflops", kT, 1, 1e6, &a.fp8_flops},
                         Field{"nvlink_gb_s", kG, 0.1, 1e5, &a.nvlink_bw},
                         Field{"network_gb_s", kG, 0.1, 1e5, &a.network_bw}}) {
    v = *f.out / f.scale;
    KESTREL_RETURN_IF_ERROR(o.number(f.key, f.lo, f.hi, v));
    *f.out = v * f.scale;
  }
  return o.integer("nvlink_domain_gpus", 1, 1 << 16, a.nvlink_domain_gpus);
}

Status parse_role(const json& j, const std::string& name, const std::string& label, RoleSpec& r) {
  Obj o(j, name, label);
  KESTREL_RETURN_IF_ERROR(o.check_keys({"nodes", "tp", "ep", "dcp", "batch"}));
  KESTREL_RETURN_IF_ERROR(o.integer("nodes", 0, 1 << 16, r.nodes));
  KESTREL_RETURN_IF_ERROR(o.integer("tp", 1, 1 << 16, r.tp));
  KESTREL_RETURN_IF_ERROR(o.integer("ep", 1, 1 << 16, r.ep));
  KESTREL_RETURN_IF_ERROR(o.integer("dcp", 1, 1 << 16, r.dcp));
  return o.integer("batch", 0, 1 << 24, r.batch);
}

Status parse_assumptions(const json& j, const std::string& label, Assumptions& a) {
  Obj o(j, "assumptions", label);
  KESTREL_RETURN_IF_ERROR(o.check_keys({"memory_utilization", "reserve_gib", "mfu", "bandwidth_efficiency",
                                        "comm_efficiency", "expert_math", "kv_cache_dtype", "conv_state_dtype",
                                        "ssm_state_dtype", "expert_format", "w4a8_group_size", "transfer_gb_s"}));
  KESTREL_RETURN_IF_ERROR(o.number("memory_utilization", 0.05, 1.0, a.memory_utilization));
  double gib = a.reserve_bytes / (1ull << 30);
  KESTREL_RETURN_IF_ERROR(o.number("reserve_gib", 0, 1e4, gib));
  a.reserve_bytes = gib * (1ull << 30);
  KESTREL_RETURN_IF_ERROR(o.number("mfu", 0.01, 1.0, a.mfu));
  KESTREL_RETURN_IF_ERROR(o.number("bandwidth_efficiency", 0.01, 1.0, a.bw_efficiency));
  KESTREL_RETURN_IF_ERROR(o.number("comm_efficiency", 0.01, 1.0, a.comm_efficiency));
  double gbs = a.transfer_bw / kG;
  KESTREL_RETURN_IF_ERROR(o.number("transfer_gb_s", 0, 1e5, gbs));
  a.transfer_bw = gbs * kG;
  std::string s;
  KESTREL_RETURN_IF_ERROR(o.choice("expert_math", {"bf16", "fp8"}, s));
  if (!s.empty()) a.expert_math_fp8 = s == "fp8";
  s.clear();
  KESTREL_RETURN_IF_ERROR(o.choice("kv_cache_dtype", {"fp32", "bf16", "fp8"}, s));
  if (!s.empty()) a.state.kv = *parse_kv_cache_dtype(s);
  s.clear();
  KESTREL_RETURN_IF_ERROR(o.choice("conv_state_dtype", {"bf16", "fp32"}, s));
  if (!s.empty()) a.state.conv = s == "fp32" ? StateDType::kF32 : StateDType::kBF16;
  s.clear();
  KESTREL_RETURN_IF_ERROR(o.choice("ssm_state_dtype", {"bf16", "fp32"}, s));
  if (!s.empty()) a.state.ssm = s == "fp32" ? StateDType::kF32 : StateDType::kBF16;
  s.clear();
  KESTREL_RETURN_IF_ERROR(o.choice("expert_format", {"checkpoint", "mxfp4", "bf16", "w4a8"}, s));
  if (!s.empty()) a.weights.experts = *parse_expert_format(s);
  return o.integer("w4a8_group_size", 8, 1 << 16, a.weights.w4a8_group_size);
}

}  // namespace

std::vector<std::string> accelerator_preset_names() {
  std::vector<std::string> v;
  for (const PresetRow& p : kPresets) v.push_back(p.name);
  return v;
}

Result<Accelerator> accelerator_preset(const std::string& name) {
  const PresetRow* p = find_preset(name);
  if (!p) {
    std::string list;
    for (const auto& n : accelerator_preset_names()) list += (list.empty() ? "" : ", ") + n;
    return invalid_argument("unknown accelerator preset '" + name + "' (known: " + list + ")");
  }
  return from_row(*p);
}

Result<ClusterSpec> cluster_preset(const std::string& accelerator) {
  auto a = accelerator_preset(accelerator);
  if (!a) return a.error();
  ClusterSpec c;
  c.accel = *a;
  c.gpus_per_node = find_preset(accelerator)->gpus_per_node;
  if (c.gpus_per_node < 8) c.prefill.nodes = c.decode.nodes = 8 / c.gpus_per_node * 4;  // same GPU count as 4 × 8
  return c;
}

Result<ClusterSpec> parse_cluster_spec(const std::string& json_text, const std::string& label) {
  const json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) return invalid_argument(label + ": not valid JSON");
  Obj o(j, "", label);
  KESTREL_RETURN_IF_ERROR(o.check_keys({"accelerator", "gpus_per_node", "context", "prefill", "decode", "assumptions"}));
  if (!o.has("accelerator")) return o.err("accelerator", "missing required key (a preset name or an object)");
  ClusterSpec c;
  KESTREL_RETURN_IF_ERROR(parse_accelerator(j["accelerator"], label, c.accel, c.gpus_per_node));
  KESTREL_RETURN_IF_ERROR(o.integer("gpus_per_node", 1, 1 << 10, c.gpus_per_node));
  KESTREL_RETURN_IF_ERROR(o.integer("context", 1, int64_t{1} << 34, c.context));
  if (o.has("prefill")) KESTREL_RETURN_IF_ERROR(parse_role(j["prefill"], "prefill", label, c.prefill));
  if (o.has("decode")) KESTREL_RETURN_IF_ERROR(parse_role(j["decode"], "decode", label, c.decode));
  if (o.has("assumptions")) KESTREL_RETURN_IF_ERROR(parse_assumptions(j["assumptions"], label, c.a));
  return c;
}

Status validate(const ClusterSpec& c, const ModelConfig& cfg) {
  const Accelerator& a = c.accel;
  if (!(a.hbm_bytes > 0 && a.hbm_bw > 0 && a.bf16_flops > 0 && a.fp8_flops > 0 && a.nvlink_bw > 0 && a.network_bw > 0))
    return invalid_argument("accelerator '" + a.name + "': every capacity, bandwidth and peak must be positive");
  if (c.gpus_per_node < 1) return invalid_argument("gpus_per_node must be at least 1");
  if (c.context < 1) return invalid_argument("context must be at least 1 token");
  if (c.prefill.nodes + c.decode.nodes < 1) return invalid_argument("no prefill or decode nodes");
  const int heads = cfg.text.num_attention_heads, kda = cfg.text.linear_attn.num_heads;
  for (const auto& [name, r] : {std::pair<const char*, const RoleSpec&>{"prefill", c.prefill}, {"decode", c.decode}}) {
    if (r.nodes == 0) continue;
    const std::string role = name;
    if (r.tp < 1 || r.ep < 1 || r.dcp < 1 || r.nodes < 0 || r.batch < 0)
      return invalid_argument(role + ": tp, ep, dcp must be ≥ 1, nodes and batch ≥ 0");
    if (heads % r.tp != 0 || kda % r.tp != 0)
      return invalid_argument(role + ": tp " + std::to_string(r.tp) + " must divide the attention heads (" +
                              std::to_string(heads) + ") and the KDA heads (" + std::to_string(kda) + ")");
    const int w = std::max(r.tp, r.ep);
    if (w % r.tp != 0 || w % r.ep != 0)
      return invalid_argument(role + ": one of tp (" + std::to_string(r.tp) + ") and ep (" + std::to_string(r.ep) +
                              ") must divide the other (instance size = the larger)");
    if (r.tp % r.dcp != 0)
      return invalid_argument(role + ": dcp " + std::to_string(r.dcp) + " must divide tp " + std::to_string(r.tp));
    const long long gpus = static_cast<long long>(r.nodes) * c.gpus_per_node;
    if (gpus % w != 0)
      return invalid_argument(role + ": instance size " + std::to_string(w) + " (max of tp, ep) does not divide its " +
                              std::to_string(gpus) + " GPUs");
  }
  const Assumptions& s = c.a;
  if (!(s.memory_utilization > 0 && s.memory_utilization <= 1 && s.mfu > 0 && s.mfu <= 1 && s.bw_efficiency > 0 &&
        s.bw_efficiency <= 1 && s.comm_efficiency > 0 && s.comm_efficiency <= 1 && s.reserve_bytes >= 0 &&
        s.transfer_bw >= 0 && std::isfinite(s.transfer_bw)))
    return invalid_argument("assumptions: utilization and efficiencies must be in (0, 1], reserve and transfer ≥ 0");
  return Status::ok();
}

}  // namespace kestrel::plan
