#include "plan/cell_plan.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string_view>

#include "dist/expert_partition.h"
#include "loader/checkpoint.h"
#include "plan/model_costs.h"

namespace kestrel::plan {

namespace {
// N of the first "<key>N." in a tensor name (digits then a dot), or -1.
int64_t number_after(std::string_view name, std::string_view key) {
  for (size_t at = name.find(key); at != std::string_view::npos; at = name.find(key, at + 1)) {
    size_t i = at + key.size();
    int64_t n = 0;
    const size_t first = i;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < (int64_t{1} << 40)) n = n * 10 + (name[i++] - '0');
    if (i > first && i < name.size() && name[i] == '.') return n;
  }
  return -1;
}

// P(none of a token's K distinct experts, drawn uniformly from E, is among n given ones) = C(E−n, K) / C(E, K).
double p_none(int64_t E, int64_t n, int64_t K) {
  if (E - n < K) return 0.0;
  double p = 1.0;
  for (int64_t i = 0; i < K; ++i) p *= static_cast<double>(E - n - i) / static_cast<double>(E - i);
  return p;
}
}  // namespace

Result<CellPlan> make_cell_plan(const ModelConfig& cfg, const std::string& checkpoint_dir, int ep, int64_t batch,
                                int64_t context, KvCacheDtype kv) {
  if (ep < 1) return invalid_argument("--ep must be at least 1");
  if (batch < 0 || context < 0) return invalid_argument("--batch and --context must not be negative");
  InventoryOptions io;  // the checkpoint's own expert format: what the ranks bind
  auto inv = build_inventory(cfg, io);
  if (!inv) return inv.error();
  StateOptions so{kv, StateDType::kF32, StateDType::kF32};  // Kestrel's CPU KDA state is fp32
  const ModelCosts m = compute_costs(cfg, *inv, so);
  const TextConfig& t = cfg.text;
  CellPlan p;
  p.ep = ep, p.batch = batch, p.context = context, p.kv = kv;
  p.moe_layers = m.moe_layers, p.num_experts = t.num_experts, p.top_k = t.num_experts_per_token;
  p.routed_width = m.routed_width, p.vocab = t.vocab_size;
  const int64_t E = t.num_experts, K = t.num_experts_per_token;
  std::vector<int64_t> expert_bytes(static_cast<size_t>(E), 0);  // one expert id's tensors over all MoE layers
  if (!checkpoint_dir.empty()) {
    auto ck = Checkpoint::open(checkpoint_dir);
    if (!ck) return ck.error();
    for (const std::string& name : ck->names()) {
      if (name.find("vision_tower.") != std::string::npos || name.find("mm_projector.") != std::string::npos) continue;
      if (number_after(name, "layers.") >= t.num_hidden_layers) continue;  // MTP
      const auto b = static_cast<int64_t>(ck->tensor_bytes(name));
      if (const int64_t x = number_after(name, ".experts."); x >= 0 && x < E) {
        expert_bytes[static_cast<size_t>(x)] += b;
        p.routed_bytes += b;
      } else {
        p.replicated_bytes += b;
      }
    }
  } else {
    for (const TensorEntry& e : inv->tensors) {
      if (e.component == Component::kVision) continue;  // validated at load, never bound
      if (e.component == Component::kRoutedExperts) {
        for (auto& b : expert_bytes) b += e.bytes_per_copy();
        p.routed_bytes += e.bytes();
      } else {
        p.replicated_bytes += e.bytes();
      }
    }
  }
  if (m.moe_layers > 0 && t.num_experts < ep)
    return invalid_argument("--ep " + std::to_string(ep) + " exceeds the " + std::to_string(t.num_experts) +
                            " routed experts");
  p.cache_bytes_per_token = m.cache_bytes_per_token();
  p.state_bytes_per_request = m.state_bytes_per_request();
  for (int r = 0; r < ep; ++r) {
    CellRankPlan rp;
    rp.rank = r;
    rp.experts = m.moe_layers > 0 ? dist::experts_of(E, ep, r) : 0;
    for (int64_t e = dist::first_expert(E, ep, r); m.moe_layers > 0 && e < dist::first_expert(E, ep, r + 1); ++e)
      rp.expert_bytes += expert_bytes[static_cast<size_t>(e)];
    rp.weight_bytes = p.replicated_bytes + rp.expert_bytes;
    rp.requests = batch / ep + (r < batch % ep ? 1 : 0);
    rp.cache_bytes = rp.requests * (context * p.cache_bytes_per_token + p.state_bytes_per_request);
    p.ranks.push_back(rp);
  }
  if (ep > 1 && m.moe_layers > 0) {
    // A token held by rank o (o uniform over the ranks, as the round-robin placement makes it in the mean).
    double remote = 0, remote_slots = 0;
    for (int o = 0; o < ep; ++o) {
      for (int r = 0; r < ep; ++r)
        if (r != o) remote += 1.0 - p_none(E, dist::experts_of(E, ep, r), K);
      remote_slots += static_cast<double>(K) * static_cast<double>(E - dist::experts_of(E, ep, o)) / static_cast<double>(E);
    }
    p.remote_ranks_per_token = remote / ep;
    p.dispatch_bytes_per_token_layer = p.remote_ranks_per_token * static_cast<double>(K + m.routed_width) * 4.0;
    p.combine_bytes_per_token_layer = remote_slots / ep * m.routed_width * 4.0;
    p.count_step_bytes = static_cast<double>(m.moe_layers) * ep * (ep - 1) * 8.0;
    p.moe_step_bytes = static_cast<double>(m.moe_layers) * static_cast<double>(batch) *
                           (p.dispatch_bytes_per_token_layer + p.combine_bytes_per_token_layer) +
                       p.count_step_bytes;
  }
  if (ep > 1) {
    p.plan_step_bytes = static_cast<double>(ep - 1) * (8.0 + 4.0 * static_cast<double>(2 + 5 * batch));
    const int64_t off_rank0 = batch - p.ranks[0].requests;
    p.logits_step_bytes = static_cast<double>(off_rank0) * t.vocab_size * 4.0;
  }
  return p;
}

std::string cell_plan_json(const CellPlan& p) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const CellRankPlan& r : p.ranks)
    ranks.push_back({{"rank", r.rank}, {"experts", r.experts}, {"weight_bytes", r.weight_bytes},
                     {"expert_bytes", r.expert_bytes}, {"requests", r.requests}, {"cache_bytes", r.cache_bytes}});
  nlohmann::json j = {
      {"ep", p.ep}, {"batch", p.batch}, {"context", p.context}, {"kv_cache_dtype", std::string(kv_cache_dtype_name(p.kv))},
      {"moe_layers", p.moe_layers}, {"num_experts", p.num_experts}, {"top_k", p.top_k},
      {"routed_width", p.routed_width}, {"replicated_bytes", p.replicated_bytes}, {"routed_bytes", p.routed_bytes},
      {"cache_bytes_per_token", p.cache_bytes_per_token}, {"state_bytes_per_request", p.state_bytes_per_request},
      {"ranks", ranks},
      {"decode_step",
       {{"remote_ranks_per_token", p.remote_ranks_per_token},
        {"dispatch_bytes_per_token_layer", p.dispatch_bytes_per_token_layer},
        {"combine_bytes_per_token_layer", p.combine_bytes_per_token_layer},
        {"moe_bytes", p.moe_step_bytes}, {"count_bytes", p.count_step_bytes}, {"plan_bytes", p.plan_step_bytes},
        {"logits_bytes", p.logits_step_bytes}, {"total_bytes", p.step_bytes()}}}};
  return j.dump(2) + "\n";
}

std::string cell_plan_table(const CellPlan& p) {
  std::string out;
  char b[512];
  std::snprintf(b, sizeof b,
                "cell of %d ranks (expert parallel, data-parallel attention), batch %lld at %lld tokens, %s cache\n"
                "weights: %lld replicated + %lld routed-expert bytes (%d MoE layers × %d experts, top-%d)\n\n"
                "%-5s %8s %16s %16s %9s %16s\n",
                p.ep, static_cast<long long>(p.batch), static_cast<long long>(p.context),
                std::string(kv_cache_dtype_name(p.kv)).c_str(), static_cast<long long>(p.replicated_bytes),
                static_cast<long long>(p.routed_bytes), p.moe_layers, p.num_experts, p.top_k, "rank", "experts",
                "weight bytes", "expert bytes", "requests", "cache bytes");
  out += b;
  for (const CellRankPlan& r : p.ranks) {
    std::snprintf(b, sizeof b, "%-5d %8lld %16lld %16lld %9lld %16lld\n", r.rank, static_cast<long long>(r.experts),
                  static_cast<long long>(r.weight_bytes), static_cast<long long>(r.expert_bytes),
                  static_cast<long long>(r.requests), static_cast<long long>(r.cache_bytes));
    out += b;
  }
  std::snprintf(b, sizeof b,
                "\ndecode step (all ranks, bytes to other ranks; MoE under uniform routing): %.0f\n"
                "  MoE dispatch + combine + counts %.0f (%.2f remote ranks per token; per token per layer: dispatch "
                "%.0f, combine %.0f)\n  plan broadcast %.0f, logits to rank 0 %.0f\n",
                p.step_bytes(), p.moe_step_bytes, p.remote_ranks_per_token, p.dispatch_bytes_per_token_layer,
                p.combine_bytes_per_token_layer, p.plan_step_bytes, p.logits_step_bytes);
  out += b;
  return out;
}

}  // namespace kestrel::plan
