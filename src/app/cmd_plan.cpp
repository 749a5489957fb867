// `kestrel plan --model CONFIG --cluster SPEC [overrides] [--json]`: memory per device, cache
// capacity and roofline throughput of a prefill/decode layout. Reads only config.json.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/args.h"
#include "app/commands.h"
#include "loader/model_config.h"
#include "plan/cell_plan.h"
#include "plan/plan_output.h"
#include "plan/planner.h"

namespace kestrel::app {
namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --model: a checkpoint dir (its config.json) or a config.json path.
Result<ModelConfig> load_config(const std::string& model) {
  std::error_code ec;
  const std::string path = std::filesystem::is_directory(model, ec)
                               ? (std::filesystem::path(model) / "config.json").string()
                               : model;
  auto text = read_file(path);
  if (!text) return text.error();
  return parse_model_config(*text, path);
}

// --cluster: a preset accelerator name (4 prefill + 4 decode nodes) or a JSON file.
Result<plan::ClusterSpec> load_cluster(const std::string& spec) {
  std::error_code ec;
  if (!std::filesystem::exists(spec, ec) && spec.find('/') == std::string::npos &&
      spec.find(".json") == std::string::npos)
    return plan::cluster_preset(spec);
  auto text = read_file(spec);
  if (!text) return text.error();
  return plan::parse_cluster_spec(*text, spec);
}

Status apply_overrides(const Args& a, plan::ClusterSpec& c) {
  auto set_int = [&](const char* flag, auto& field, long long lo, long long hi) -> Status {
    auto v = a.integer_or(flag, static_cast<long long>(field));
    if (!v) return v.error();
    if (*v < lo || *v > hi)
      return invalid_argument(std::string("--") + flag + ": " + std::to_string(*v) + " is outside " +
                              std::to_string(lo) + ".." + std::to_string(hi));
    field = static_cast<std::remove_reference_t<decltype(field)>>(*v);
    return Status::ok();
  };
  auto set_num = [&](const char* flag, double& field, double lo, double hi) -> Status {
    auto v = a.number_or(flag, field);
    if (!v) return v.error();
    if (!(*v >= lo && *v <= hi))
      return invalid_argument(std::string("--") + flag + ": must be in " + std::to_string(lo) + ".." + std::to_string(hi));
    field = *v;
    return Status::ok();
  };
  KESTREL_RETURN_IF_ERROR(set_int("prefill-nodes", c.prefill.nodes, 0, 1 << 16));
  KESTREL_RETURN_IF_ERROR(set_int("decode-nodes", c.decode.nodes, 0, 1 << 16));
  KESTREL_RETURN_IF_ERROR(set_int("gpus-per-node", c.gpus_per_node, 1, 1 << 10));
  KESTREL_RETURN_IF_ERROR(set_int("context", c.context, 1, int64_t{1} << 34));
  // --tp/--ep/--dcp set both roles; --prefill-tp, --decode-ep, ... set one.
  for (const char* role : {"", "prefill-", "decode-"}) {
    const std::string r = role;
    for (plan::RoleSpec* s : {&c.prefill, &c.decode}) {
      if (!r.empty() && (s == &c.prefill) != (r == "prefill-")) continue;
      KESTREL_RETURN_IF_ERROR(set_int((r + "tp").c_str(), s->tp, 1, 1 << 16));
      KESTREL_RETURN_IF_ERROR(set_int((r + "ep").c_str(), s->ep, 1, 1 << 16));
      KESTREL_RETURN_IF_ERROR(set_int((r + "dcp").c_str(), s->dcp, 1, 1 << 16));
    }
  }
  KESTREL_RETURN_IF_ERROR(set_int("batch", c.decode.batch, 0, 1 << 24));
  KESTREL_RETURN_IF_ERROR(set_num("mfu", c.a.mfu, 0.01, 1));
  KESTREL_RETURN_IF_ERROR(set_num("bw-efficiency", c.a.bw_efficiency, 0.01, 1));
  KESTREL_RETURN_IF_ERROR(set_num("memory-utilization", c.a.memory_utilization, 0.05, 1));
  double gib = c.a.reserve_bytes / (1ull << 30);
  KESTREL_RETURN_IF_ERROR(set_num("reserve-gib", gib, 0, 1e4));
  c.a.reserve_bytes = gib * (1ull << 30);
  double gbs = c.a.transfer_bw / 1e9;
  KESTREL_RETURN_IF_ERROR(set_num("transfer-gbps", gbs, 0, 1e5));
  c.a.transfer_bw = gbs * 1e9;
  if (a.has("kv-cache-dtype")) {
    auto kv = kv_cache_dtype_flag(a);
    if (!kv) return kv.error();
    c.a.state.kv = *kv;
  }
  if (a.has("expert-format")) {
    auto f = plan::parse_expert_format(a.str("expert-format"));
    if (!f) return f.error();
    c.a.weights.experts = *f;
  }
  KESTREL_RETURN_IF_ERROR(set_int("w4a8-group-size", c.a.weights.w4a8_group_size, 8, 1 << 16));
  if (a.has("expert-math")) {
    const std::string v = a.str("expert-math");
    if (v != "bf16" && v != "fp8") return invalid_argument("--expert-math must be bf16 or fp8");
    c.a.expert_math_fp8 = v == "fp8";
  }
  return Status::ok();
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  auto fail = [](const Status& s) { std::fprintf(stderr, "kestrel plan: %s\n", s.message().c_str()); return 1; };
  int exit_code = 0;
  auto a = Args::parse("plan", argv, exit_code);
  if (!a) return exit_code;
  if (!a->has("model")) return usage_error("plan", invalid_argument("--model CONFIG (a checkpoint dir or config.json) is required"));
  auto cfg = load_config(a->str("model"));
  if (!cfg) return fail(cfg.error());
  if (a->has("cell")) {  // a CPU cell of --ep ranks (docs/cell.md)
    auto ep = a->integer_or("ep", 1);
    auto tp = a->integer_or("tp", 1);
    auto batch = a->integer_or("batch", 1);
    auto context = a->integer_or("context", 4096);
    auto kv = a->has("kv-cache-dtype") ? kv_cache_dtype_flag(*a) : Result<KvCacheDtype>(KvCacheDtype::kF32);
    if (Status bad = first_error(ep, tp, batch, context, kv); !bad.is_ok()) return usage_error("plan", bad);
    std::error_code ec;
    const std::string dir = std::filesystem::is_directory(a->str("model"), ec) ? a->str("model") : "";
    const bool has_weights = !dir.empty() && (std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors", ec) ||
                                              std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors.index.json", ec));
    auto cp = plan::make_cell_plan(*cfg, has_weights ? dir : "", static_cast<int>(*ep), *batch, *context, *kv,
                                     static_cast<int>(*tp));
    if (!cp) return usage_error("plan", cp.error());
    const std::string out = a->has("json") ? plan::cell_plan_json(*cp) : plan::cell_plan_table(*cp);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  auto cluster = load_cluster(a->str("cluster"));
  if (!cluster) return fail(cluster.error());
  Status s = apply_overrides(*a, *cluster);
  if (!s.is_ok()) return usage_error("plan", s);
  auto p = plan::make_plan(*cfg, a->str("model"), *cluster);
  if (!p) return fail(p.error());
  const std::string out = a->has("json") ? plan::plan_json(*p) : plan::plan_table(*p);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace kestrel::app
