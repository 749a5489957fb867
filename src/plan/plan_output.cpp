#include "plan/plan_output.h"

#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace kestrel::plan {
namespace {

using nlohmann::ordered_json;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const char* dtype_str(StateDType d) { return d == StateDType::kF32 ? "fp32" : "bf16"; }

ordered_json role_json(const RolePlan& r, bool prefill) {
  ordered_json j;
  j["nodes"] = r.spec.nodes;
  j["devices"] = r.devices;
  if (r.devices == 0) return j;
  j["tp"] = r.spec.tp;
  j["ep"] = r.spec.ep;
  j["dcp"] = r.spec.dcp;
  j["dp_attention"] = r.dp_attn;
  j["instance_devices"] = r.instance_devices;
  j["instances"] = r.instances;
  j["fits"] = r.fits;
  j["note"] = r.note;
  j["memory_per_device"] = {{"weights_bytes", r.weight_bytes},
                            {"weights_replicated_bytes", r.weight_replicated},
                            {"weights_tensor_parallel_bytes", r.weight_tensor},
                            {"weights_expert_bytes", r.weight_expert},
                            {"usable_bytes", r.usable_bytes},
                            {"cache_bytes", r.cache_bytes}};
  j["capacity"] = {{"cache_bytes_per_token_per_device", r.cache_bytes_per_token_device},
                   {"state_bytes_per_request_per_device", r.state_bytes_per_request_device},
                   {"request_bytes_per_device", r.request_bytes_device},
                   {"tokens_per_device", r.tokens_per_device},
                   {"tokens_per_instance", r.tokens_per_instance},
                   {"requests_per_instance", r.requests_per_instance},
                   {"requests_per_role", r.requests_per_role}};
  if (prefill) {
    j["prefill"] = {{"flops_per_token", r.prefill_flops_per_token},
                    {"tokens_per_s_per_instance", r.prefill_tokens_per_s_instance},
                    {"tokens_per_s_per_gpu", r.prefill_tokens_per_s_gpu},
                    {"tokens_per_s_role", r.prefill_tokens_per_s_role},
                    {"ttft_s", r.ttft_s}};
  } else {
    j["decode"] = {{"batch_per_instance", r.batch},
                   {"step_weight_bytes_per_device", r.step_weight_bytes},
                   {"step_cache_bytes_per_device", r.step_cache_bytes},
                   {"step_flops_per_device", r.step_flops},
                   {"t_memory_s", r.t_memory},
                   {"t_compute_s", r.t_compute},
                   {"t_comm_s", r.t_comm},
                   {"step_s", r.step_s},
                   {"tokens_per_s_per_instance", r.decode_tokens_per_s_instance},
                   {"tokens_per_s_per_gpu", r.decode_tokens_per_s_gpu},
                   {"tokens_per_s_role", r.decode_tokens_per_s_role},
                   {"tokens_per_s_per_user", r.tokens_per_s_per_user}};
  }
  return j;
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

}  // namespace

std::string plan_json(const Plan& p) {
  const ModelCosts& m = p.costs;
  const ClusterSpec& c = p.cluster;
  ordered_json j;
  j["schema"] = "kestrel.plan/1";
  ordered_json comps = ordered_json::object();
  for (int i = 0; i < kNumComponents; ++i) {
    const auto& t = m.by_component[static_cast<size_t>(i)];
    if (t.tensors == 0) continue;
    const auto& pl = m.placement[static_cast<size_t>(i)];
    comps[component_name(static_cast<Component>(i))] = {
        {"params", t.params}, {"bytes", t.bytes}, {"tensors", t.tensors}, {"bytes_replicated", pl.replicated},
        {"bytes_tensor_parallel", pl.tensor}, {"bytes_expert_parallel", pl.expert}};
  }
  const double ctx = static_cast<double>(c.context);
  j["model"] = {
      {"label", p.model_label},
      {"params", m.total_params},
      {"bytes", m.total_bytes},
      {"tensors", m.total_tensors},
      {"active_params_per_token", m.active_params},
      {"vision_counted", p.inventory.vision_counted},
      {"vision_note", p.inventory.vision_note},
      {"expert_format", expert_format_name(p.inventory.expert_format)},
      {"experts", {{"count", m.num_experts}, {"top_k", m.top_k}, {"moe_layers", m.moe_layers},
                   {"params_each", m.expert_params}, {"bytes_each", m.expert_bytes}}},
      {"layers", {{"total", m.num_layers}, {"kda", m.kda_layers}, {"mla", m.mla_layers}, {"sparse", m.sparse_layers}}},
      {"components", comps},
      {"cache", {{"bytes_per_token", m.cache_bytes_per_token()},
                 {"mla_bytes_per_token_per_layer", m.mla_bytes_per_token_per_layer},
                 {"indexer_bytes_per_token_per_layer", m.indexer_bytes_per_token_per_layer},
                 {"kda_recurrent_bytes_per_request", m.kda_recurrent_bytes},
                 {"kda_conv_bytes_per_request", m.kda_conv_bytes},
                 // A prefix-cache snapshot is one request's KDA state (conv + recurrent) at a token boundary.
                 {"prefix_snapshot_bytes", m.state_bytes_per_request()},
                 {"bytes_per_request_at_context", ctx * static_cast<double>(m.cache_bytes_per_token()) +
                                                      static_cast<double>(m.state_bytes_per_request())}}},
      {"flops_per_token", {{"linear", m.linear_flops},
                           {"prefill_attention_mean_at_context", m.prefill_attn_bf16_flops_avg(ctx)},
                           {"prefill_indexer_mean_at_context", m.prefill_indexer_flops_avg(ctx)},
                           {"decode_attention_at_context", m.mla_dense_flops(ctx, true) + m.mla_sparse_flops(ctx) +
                                                               m.kda_flops_decode},
                           {"decode_indexer_at_context", m.indexer_flops(ctx)}}}};
  const Accelerator& a = c.accel;
  const Assumptions& s = c.a;
  j["cluster"] = {
      {"accelerator", {{"name", a.name}, {"hbm_bytes", a.hbm_bytes}, {"hbm_bytes_per_s", a.hbm_bw},
                       {"bf16_flops", a.bf16_flops}, {"fp8_flops", a.fp8_flops}, {"nvlink_bytes_per_s", a.nvlink_bw},
                       {"network_bytes_per_s", a.network_bw}, {"nvlink_domain_gpus", a.nvlink_domain_gpus},
                       {"source", a.source}}},
      {"gpus_per_node", c.gpus_per_node},
      {"context", c.context},
      {"assumptions", {{"memory_utilization", s.memory_utilization}, {"reserve_bytes", s.reserve_bytes},
                       {"mfu", s.mfu}, {"bandwidth_efficiency", s.bw_efficiency},
                       {"comm_efficiency", s.comm_efficiency}, {"expert_math", s.expert_math_fp8 ? "fp8" : "bf16"},
                       {"kv_cache_dtype", std::string(kv_cache_dtype_name(s.state.kv))},
                       {"conv_state_dtype", dtype_str(s.state.conv)}, {"ssm_state_dtype", dtype_str(s.state.ssm)},
                       {"expert_format", expert_format_name(p.inventory.expert_format)},
                       {"w4a8_group_size", s.weights.w4a8_group_size}, {"transfer_bytes_per_s", s.transfer_bw}}}};
  j["roles"] = {{"prefill", role_json(p.prefill, true)}, {"decode", role_json(p.decode, false)}};
  j["transfer"] = {{"bytes_per_request", p.transfer_bytes_per_request}, {"seconds_per_request", p.transfer_s},
                   {"link_bytes_per_s", p.transfer_link_bw}, {"links", p.prefill.instance_devices},
                   {"source", p.transfer_measured ? "measured" : "roofline"}};
  return j.dump(2) + "\n";
}

std::string plan_table(const Plan& p) {
  const ModelCosts& m = p.costs;
  const ClusterSpec& c = p.cluster;
  std::string o;
  o += fmt("model %s: %.4g params (%.4g active/token), %.2f GiB weights, %lld tensors, experts %s\n",
           p.model_label.c_str(), static_cast<double>(m.total_params), static_cast<double>(m.active_params),
           static_cast<double>(m.total_bytes) / kGiB, static_cast<long long>(m.total_tensors),
           expert_format_name(p.inventory.expert_format));
  if (!p.inventory.vision_counted) o += "  (vision: " + p.inventory.vision_note + ")\n";
  o += fmt("  %-16s %14s %12s\n", "component", "params", "GiB");
  for (int i = 0; i < kNumComponents; ++i) {
    const auto& t = m.by_component[static_cast<size_t>(i)];
    if (t.tensors == 0) continue;
    o += fmt("  %-16s %14.4g %12.3f\n", component_name(static_cast<Component>(i)), static_cast<double>(t.params),
             static_cast<double>(t.bytes) / kGiB);
  }
  o += fmt("layers: %d KDA, %d MLA (%d sparse); cache %lld B/token (%s MLA rows); KDA state %.1f MiB/request (and per "
           "prefix-cache snapshot)\n",
           m.kda_layers, m.mla_layers, m.sparse_layers, static_cast<long long>(m.cache_bytes_per_token()),
           std::string(kv_cache_dtype_name(c.a.state.kv)).c_str(),
           static_cast<double>(m.state_bytes_per_request()) / (1 << 20));
  o += fmt("cluster: %s, %d GPUs/node, context %lld; MFU %.2f, HBM eff %.2f, mem util %.2f, reserve %.1f GiB\n",
           c.accel.name.c_str(), c.gpus_per_node, static_cast<long long>(c.context), c.a.mfu, c.a.bw_efficiency,
           c.a.memory_utilization, c.a.reserve_bytes / kGiB);
  for (const RolePlan* r : {&p.prefill, &p.decode}) {
    if (r->devices == 0) continue;
    o += fmt("\n%s: %d nodes = %d GPUs; instance %d GPUs (TP %d, EP %d, DCP %d, DP-attn %d) x %d\n", r->role.c_str(),
             r->spec.nodes, r->devices, r->instance_devices, r->spec.tp, r->spec.ep, r->spec.dcp, r->dp_attn,
             r->instances);
    o += fmt("  weights/GPU      %8.2f GiB (replicated %.2f, TP %.2f, experts %.2f)\n", r->weight_bytes / kGiB,
             r->weight_replicated / kGiB, r->weight_tensor / kGiB, r->weight_expert / kGiB);
    o += fmt("  cache/GPU        %8.2f GiB of %.2f usable%s%s\n", r->cache_bytes / kGiB, r->usable_bytes / kGiB,
             r->fits ? "" : "  DOES NOT FIT: ", r->note.c_str());
    o += fmt("  tokens cached    %8.4g per GPU, %.4g per instance\n", r->tokens_per_device, r->tokens_per_instance);
    o += fmt("  requests @ctx    %8lld per instance, %lld per role\n", r->requests_per_instance, r->requests_per_role);
    if (r->role == "prefill") {
      o += fmt("  prefill          %8.4g tok/s per instance, %.4g per GPU, %.4g role; TTFT %.1f s (%.3g FLOP/token)\n",
               r->prefill_tokens_per_s_instance, r->prefill_tokens_per_s_gpu, r->prefill_tokens_per_s_role, r->ttft_s,
               r->prefill_flops_per_token);
    } else if (r->batch > 0) {
      o += fmt("  decode batch     %8lld per instance; step %.2f ms (memory %.2f, compute %.2f, comm %.2f)\n", r->batch,
               r->step_s * 1e3, r->t_memory * 1e3, r->t_compute * 1e3, r->t_comm * 1e3);
      o += fmt("  decode           %8.4g tok/s per instance, %.4g per GPU, %.4g role, %.1f per user\n",
               r->decode_tokens_per_s_instance, r->decode_tokens_per_s_gpu, r->decode_tokens_per_s_role,
               r->tokens_per_s_per_user);
    }
  }
  o += fmt("\nP->D transfer: %.2f GiB per request, %.2f s (%d links of %.3g GB/s, %s)\n",
           p.transfer_bytes_per_request / kGiB, p.transfer_s, p.prefill.instance_devices, p.transfer_link_bw / 1e9,
           p.transfer_measured ? "measured hand-off throughput" : "NIC datasheet x comm efficiency");
  return o;
}

}  // namespace kestrel::plan
