#include "plan/cell_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "dist/expert_partition.h"
#include "dist/tp_partition.h"
#include "loader/checkpoint.h"
#include "plan/model_costs.h"

namespace kestrel::plan {

namespace {
// Intermediate width of a layer's shared experts together (they are bound as one MLP).
int64_t t_cfg_shared(const ModelConfig& cfg) {
  return static_cast<int64_t>(cfg.text.num_shared_experts) * cfg.text.moe_intermediate_size;
}

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

// A tensor-parallel MLP of the checkpoint: a dense layer's mlp.* or a MoE layer's shared_experts.* matrices.
// Returns the prefix ("….mlp." / "….shared_experts.") and which matrix, or an empty prefix.
std::pair<std::string, std::string> tp_mlp_of(const std::string& name) {
  for (const char* m : {"gate_proj", "up_proj", "down_proj"})
    for (const char* part : {".weight", ".weight_scale_inv"}) {
      const std::string tail = std::string(m) + part;
      if (name.size() <= tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) continue;
      const std::string prefix = name.substr(0, name.size() - tail.size());
      const auto ends = [&](std::string_view s) {
        return prefix.size() >= s.size() && prefix.compare(prefix.size() - s.size(), s.size(), s) == 0;
      };
      if (ends(".shared_experts.") || (ends(".mlp.") && prefix.find(".experts.") == std::string::npos)) return {prefix, m};
    }
  return {};
}

// Bytes member j of a TP group binds of one MLP ([inter, hid] gate and up, [hid, inter] down, element size esz,
// FP8 scale blocks when block is 128): the rows / columns [i0, i1) and their scale blocks.
int64_t tp_member_bytes(int64_t inter, int64_t hid, int64_t esz, int64_t block, int tp, int j) {
  const auto [i0, i1] = dist::tp_slice(inter, block, tp, j);
  int64_t b = 3 * (i1 - i0) * hid * esz;
  if (block > 1) {
    const auto nb = [block](int64_t n) { return (n + block - 1) / block; };
    const int64_t s = i1 > i0 ? nb(i1) - i0 / block : 0;
    b += 3 * s * nb(hid) * 4;
  }
  return b;
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
                                int64_t context, KvCacheDtype kv, int tp) {
  if (ep < 1) return invalid_argument("--ep must be at least 1");
  if (tp < 1 || ep % tp != 0)
    return invalid_argument("--tp " + std::to_string(tp) + " must divide --ep " + std::to_string(ep));
  if (tp > 1 && checkpoint_dir.empty())
    return invalid_argument("--tp needs a checkpoint directory (the slices' bytes follow its tensor formats)");
  if (batch < 0 || context < 0) return invalid_argument("--batch and --context must not be negative");
  InventoryOptions io;  // the checkpoint's own expert format: what the ranks bind
  auto inv = build_inventory(cfg, io);
  if (!inv) return inv.error();
  StateOptions so{kv, StateDType::kF32, StateDType::kF32};  // Kestrel's CPU KDA state is fp32
  const ModelCosts m = compute_costs(cfg, *inv, so);
  const TextConfig& t = cfg.text;
  CellPlan p;
  p.ep = ep, p.tp = tp, p.batch = batch, p.context = context, p.kv = kv;
  struct TpMlp {
    int64_t gate_bytes = 0;
    bool fp8 = false;
  };
  std::map<std::string, TpMlp> tp_mlps;  // prefix → its gate tensor's bytes and format
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
      if (const auto [prefix, m] = tp_mlp_of(name); tp > 1 && !prefix.empty()) {
        p.tp_full_bytes += b;
        TpMlp& t = tp_mlps[prefix];
        if (m == "gate_proj" && name.ends_with(".weight")) t.gate_bytes = b;
        if (name.ends_with("_scale_inv")) t.fp8 = true;
      } else if (const int64_t x = number_after(name, ".experts."); x >= 0 && x < E) {
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
    for (const auto& [prefix, t] : tp_mlps) {
      const bool shared = prefix.ends_with(".shared_experts.");
      const int64_t inter = shared ? static_cast<int64_t>(t_cfg_shared(cfg)) : cfg.text.intermediate_size;
      const int64_t hid = cfg.text.hidden_size;
      const int64_t esz = t.fp8 ? 1 : t.gate_bytes / std::max<int64_t>(1, inter * hid);
      rp.tp_bytes += tp_member_bytes(inter, hid, esz, t.fp8 ? 128 : 1, tp, r % tp);
    }
    rp.weight_bytes = p.replicated_bytes + rp.expert_bytes + rp.tp_bytes;
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
  p.tp_mlps = static_cast<int>(tp_mlps.size());
  if (tp > 1)  // per MLP: every rank sends T−1 counts, and each token's row out and its partial back, T−1 times
    p.tp_step_bytes = static_cast<double>(p.tp_mlps) *
                      (static_cast<double>(ep) * (tp - 1) * 8.0 +
                       static_cast<double>(batch) * 2.0 * (tp - 1) * static_cast<double>(t.hidden_size) * 4.0);
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
                     {"expert_bytes", r.expert_bytes}, {"tp_bytes", r.tp_bytes}, {"requests", r.requests}, {"cache_bytes", r.cache_bytes}});
  nlohmann::json j = {
      {"ep", p.ep}, {"tp", p.tp}, {"tp_mlps", p.tp_mlps}, {"tp_full_bytes", p.tp_full_bytes}, {"batch", p.batch}, {"context", p.context}, {"kv_cache_dtype", std::string(kv_cache_dtype_name(p.kv))},
      {"moe_layers", p.moe_layers}, {"num_experts", p.num_experts}, {"top_k", p.top_k},
      {"routed_width", p.routed_width}, {"replicated_bytes", p.replicated_bytes}, {"routed_bytes", p.routed_bytes},
      {"cache_bytes_per_token", p.cache_bytes_per_token}, {"state_bytes_per_request", p.state_bytes_per_request},
      {"ranks", ranks},
      {"decode_step",
       {{"remote_ranks_per_token", p.remote_ranks_per_token},
        {"dispatch_bytes_per_token_layer", p.dispatch_bytes_per_token_layer},
        {"combine_bytes_per_token_layer", p.combine_bytes_per_token_layer},
        {"moe_bytes", p.moe_step_bytes}, {"count_bytes", p.count_step_bytes}, {"plan_bytes", p.plan_step_bytes},
        {"logits_bytes", p.logits_step_bytes}, {"tp_bytes", p.tp_step_bytes}, {"total_bytes", p.step_bytes()}}}};
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
  if (p.tp > 1) {
    std::snprintf(b, sizeof b,
                  "\ntensor parallel: groups of %d ranks; %d MLPs (dense layers, shared experts) of %lld bytes cut "
                  "over each group (a rank's slices are in its weight bytes)\n",
                  p.tp, p.tp_mlps, static_cast<long long>(p.tp_full_bytes));
    out += b;
  }
  std::snprintf(b, sizeof b,
                "\ndecode step (all ranks, bytes to other ranks; MoE under uniform routing): %.0f\n"
                "  MoE dispatch + combine + counts %.0f (%.2f remote ranks per token; per token per layer: dispatch "
                "%.0f, combine %.0f)\n  plan broadcast %.0f, logits to rank 0 %.0f, tensor-parallel MLPs %.0f\n",
                p.step_bytes(), p.moe_step_bytes, p.remote_ranks_per_token, p.dispatch_bytes_per_token_layer,
                p.combine_bytes_per_token_layer, p.plan_step_bytes, p.logits_step_bytes, p.tp_step_bytes);
  out += b;
  return out;
}

}  // namespace kestrel::plan
