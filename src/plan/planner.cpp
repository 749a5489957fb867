#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kestrel::plan {
namespace {

// Matmul parameters outside routed experts, embedding and vision, by placement: replicated ones are
// computed on every TP rank, tensor-parallel ones once per TP group.
struct DenseSplit {
  double repl_params = 0, tensor_params = 0;  // matmul parameters
  double repl_bytes = 0, tensor_bytes = 0;    // bytes read once per step
};

bool per_token_component(Component c) {
  return c != Component::kEmbedding && c != Component::kVision && c != Component::kRoutedExperts;
}

DenseSplit dense_split(const Inventory& inv) {
  DenseSplit d;
  for (const TensorEntry& e : inv.tensors) {
    if (!per_token_component(e.component)) continue;
    const double p = static_cast<double>(e.params * e.copies), b = static_cast<double>(e.bytes());
    if (e.placement == Placement::kReplicated) d.repl_params += p, d.repl_bytes += b;
    else d.tensor_params += p, d.tensor_bytes += b;
  }
  return d;
}

struct Ctx {
  const ModelCosts& m;
  const ClusterSpec& c;
  DenseSplit d;
  double peak_expert() const { return c.a.expert_math_fp8 ? c.accel.fp8_flops : c.accel.bf16_flops; }
  double link_bw(int group) const {
    return (group <= c.accel.nvlink_domain_gpus ? c.accel.nvlink_bw : c.accel.network_bw) * c.a.comm_efficiency;
  }
};

void plan_memory(const Ctx& x, RolePlan& r) {
  const ModelCosts& m = x.m;
  const RoleSpec& s = r.spec;
  const int W = r.instance_devices;
  for (int i = 0; i < kNumComponents; ++i) {
    r.weight_replicated += static_cast<double>(m.placement[static_cast<size_t>(i)].replicated);
    r.weight_tensor += static_cast<double>(m.placement[static_cast<size_t>(i)].tensor) / s.tp;
  }
  if (m.moe_layers > 0) {  // whole experts per EP rank, each split further over W / ep ranks
    const double per_rank = std::ceil(static_cast<double>(m.num_experts) / s.ep);
    r.weight_expert = per_rank * static_cast<double>(m.expert_bytes) * m.moe_layers / (W / s.ep);
  }
  r.weight_bytes = r.weight_replicated + r.weight_tensor + r.weight_expert;
  r.usable_bytes = x.c.accel.hbm_bytes * x.c.a.memory_utilization - x.c.a.reserve_bytes;
  r.cache_bytes = std::max(0.0, r.usable_bytes - r.weight_bytes);

  const double ctx = static_cast<double>(x.c.context);
  r.cache_bytes_per_token_device = static_cast<double>(m.cache_bytes_per_token()) / s.dcp;
  r.state_bytes_per_request_device = static_cast<double>(m.state_bytes_per_request()) / s.tp;
  r.request_bytes_device = ctx * r.cache_bytes_per_token_device + r.state_bytes_per_request_device;
  if (m.cache_bytes_per_token() > 0) {
    r.tokens_per_device = r.cache_bytes / static_cast<double>(m.cache_bytes_per_token());
    // Distinct tokens: the cache is split over dcp ranks and copied on the tp/dcp others.
    r.tokens_per_instance = r.cache_bytes / r.cache_bytes_per_token_device * (static_cast<double>(W) / s.tp);
  }
  // Requests per DP group; capped so a stateless toy model cannot overflow the count.
  const double fit = r.request_bytes_device > 0 ? std::floor(r.cache_bytes / r.request_bytes_device) : 1e12;
  const long long per_dp = static_cast<long long>(std::min(fit, 1e12));
  r.requests_per_instance = per_dp * r.dp_attn;
  r.requests_per_role = r.requests_per_instance * r.instances;
  if (r.weight_bytes > r.usable_bytes) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "weights need %.1f GiB per device, %.1f GiB usable", r.weight_bytes / (1 << 30),
                  r.usable_bytes / (1 << 30));
    r.note = buf;
  } else if (per_dp < 1) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "one %lld-token request needs %.1f GiB per device, %.1f GiB left for cache",
                  static_cast<long long>(x.c.context), r.request_bytes_device / (1 << 30), r.cache_bytes / (1 << 30));
    r.note = buf;
  }
  r.fits = r.note.empty();
}

// Device-seconds of compute per token, and the per-token FLOPs, for a prompt of length L.
void plan_prefill(const Ctx& x, RolePlan& r) {
  const ModelCosts& m = x.m;
  const RoleSpec& s = r.spec;
  const Accelerator& a = x.c.accel;
  const double L = static_cast<double>(x.c.context), mfu = x.c.a.mfu;
  const double attn = m.prefill_attn_bf16_flops_avg(L);      // split over the TP group by heads
  const double idx = m.prefill_indexer_flops_avg(L);         // fp8, replicated over TP, split by dcp
  const double dense_dev = 2 * (x.d.tensor_params / s.tp + x.d.repl_params);  // per TP rank per token
  r.prefill_flops_per_token = 2 * (x.d.tensor_params + x.d.repl_params) + m.expert_linear_flops + attn + idx;
  const double ds = (s.tp * dense_dev + attn) / (a.bf16_flops * mfu) +
                    idx * (static_cast<double>(s.tp) / s.dcp) / (a.fp8_flops * mfu) +
                    m.expert_linear_flops / (x.peak_expert() * mfu);
  r.prefill_tokens_per_s_instance = r.instance_devices / ds;
  r.prefill_tokens_per_s_gpu = r.prefill_tokens_per_s_instance / r.instance_devices;
  r.prefill_tokens_per_s_role = r.prefill_tokens_per_s_instance * r.instances;
  const double per_token_alone = (dense_dev + attn / s.tp) / (a.bf16_flops * mfu) +
                                 idx / s.dcp / (a.fp8_flops * mfu) +
                                 m.expert_linear_flops / r.instance_devices / (x.peak_expert() * mfu);
  r.ttft_s = L * per_token_alone;
}

void plan_decode(const Ctx& x, RolePlan& r) {
  const ModelCosts& m = x.m;
  const RoleSpec& s = r.spec;
  const Accelerator& a = x.c.accel;
  const int W = r.instance_devices;
  const double C = static_cast<double>(x.c.context), mfu = x.c.a.mfu;
  r.batch = s.batch > 0 ? s.batch : r.requests_per_instance;
  if (s.batch > 0 && s.batch > r.requests_per_instance && r.fits) {
    r.note = "batch " + std::to_string(s.batch) + " exceeds the " + std::to_string(r.requests_per_instance) +
             " requests the cache holds per instance";
    r.fits = false;
  }
  if (r.batch < 1) return;
  const double B = static_cast<double>(r.batch);
  const double b = std::ceil(B / r.dp_attn);  // sequences on the busiest DP group

  // Weights read once per step: the device's dense shard + the experts the batch touches
  // (uniform routing: an expert is idle with probability (1 − k/E)^B).
  r.step_weight_bytes = x.d.repl_bytes + x.d.tensor_bytes / s.tp;
  if (m.moe_layers > 0) {
    const double touched = 1 - std::pow(1 - static_cast<double>(m.top_k) / m.num_experts, B);
    r.step_weight_bytes += r.weight_expert * touched;
  }
  // Cache read per step: full latent history of dense MLA layers, top-k rows + all indexer keys of
  // sparse layers (split over dcp), KDA state read and written (split over tp by heads).
  const double dense_mla = m.mla_layers - m.sparse_layers;
  const double mla_row = static_cast<double>(m.mla_bytes_per_token_per_layer);
  const double per_seq = (dense_mla * C * mla_row +
                          m.sparse_layers * (std::min<double>(C, m.index_topk) * mla_row +
                                             C * static_cast<double>(m.indexer_bytes_per_token_per_layer))) / s.dcp +
                         2.0 * static_cast<double>(m.state_bytes_per_request()) / s.tp;
  r.step_cache_bytes = b * per_seq;

  const double bf16 = b * (2 * (x.d.tensor_params / s.tp + x.d.repl_params) +
                           (m.mla_dense_flops(C, /*absorbed=*/true) + m.mla_sparse_flops(C) + m.kda_flops_decode) / s.tp);
  const double fp8 = b * m.indexer_flops(C) / s.dcp;
  const double ex = B * m.expert_linear_flops / W;
  r.step_flops = bf16 + fp8 + ex;
  r.t_compute = bf16 / (a.bf16_flops * mfu) + fp8 / (a.fp8_flops * mfu) + ex / (x.peak_expert() * mfu);
  r.t_memory = (r.step_weight_bytes + r.step_cache_bytes) / (a.hbm_bw * x.c.a.bw_efficiency);
  // EP dispatch + combine of each token's routed input (bf16), once per MoE layer, and two TP
  // all-reduces of the hidden state per layer (ring: 2(tp−1)/tp of the message).
  double comm = 0;
  if (m.moe_layers > 0 && W > 1)
    comm += B / W * m.top_k * static_cast<double>(m.routed_width) * 2.0 * 2.0 * m.moe_layers / x.link_bw(W);
  if (s.tp > 1)
    comm += 2.0 * (s.tp - 1) / s.tp * b * static_cast<double>(m.hidden) * 2.0 * 2.0 * m.num_layers / x.link_bw(s.tp);
  r.t_comm = comm;
  r.step_s = std::max({r.t_memory, r.t_compute, r.t_comm});
  r.decode_tokens_per_s_instance = B / r.step_s;
  r.decode_tokens_per_s_gpu = r.decode_tokens_per_s_instance / W;
  r.decode_tokens_per_s_role = r.decode_tokens_per_s_instance * r.instances;
  r.tokens_per_s_per_user = 1 / r.step_s;
}

RolePlan plan_role(const Ctx& x, const char* name, const RoleSpec& s, bool prefill) {
  RolePlan r;
  r.role = name;
  r.spec = s;
  if (s.nodes == 0) return r;
  r.devices = s.nodes * x.c.gpus_per_node;
  r.instance_devices = std::max(s.tp, s.ep);
  r.instances = r.devices / r.instance_devices;
  r.dp_attn = r.instance_devices / s.tp;
  plan_memory(x, r);
  if (r.weight_bytes > r.usable_bytes) return r;  // no throughput for a layout that cannot load
  if (prefill) plan_prefill(x, r);
  else plan_decode(x, r);
  return r;
}

}  // namespace

Result<Plan> make_plan(const ModelConfig& cfg, const std::string& model_label, const ClusterSpec& cluster) {
  if (cfg.arch == Arch::kQwen3Moe)
    return unsupported("model_type '" + cfg.model_type +
                       "': the planner models Kimi (KDA + MLA) and DeepSeek (MLA) checkpoints; grouped-query "
                       "attention (Qwen3-MoE) is not modelled");
  KESTREL_RETURN_IF_ERROR(validate(cluster, cfg));
  auto inv = build_inventory(cfg, cluster.a.weights);
  if (!inv) return inv.error();
  Plan p;
  p.model_label = model_label;
  p.inventory = std::move(*inv);
  p.costs = compute_costs(cfg, p.inventory, cluster.a.state);
  p.cluster = cluster;
  const Ctx x{p.costs, p.cluster, dense_split(p.inventory)};
  p.prefill = plan_role(x, "prefill", cluster.prefill, true);
  p.decode = plan_role(x, "decode", cluster.decode, false);
  p.transfer_bytes_per_request = static_cast<double>(cluster.context) * static_cast<double>(p.costs.cache_bytes_per_token()) +
                                 static_cast<double>(p.costs.state_bytes_per_request());
  p.transfer_measured = cluster.a.transfer_bw > 0;
  p.transfer_link_bw = p.transfer_measured ? cluster.a.transfer_bw : cluster.accel.network_bw * cluster.a.comm_efficiency;
  if (p.prefill.devices > 0) p.transfer_s = p.transfer_bytes_per_request / (p.prefill.instance_devices * p.transfer_link_bw);
  return p;
}

}  // namespace kestrel::plan
