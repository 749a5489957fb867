// Per-model quantities `kestrel plan` needs, derived from the inventory and the typed config:
// parameter/byte totals per component, active parameters per token, cache bytes per token, fixed
// per-request state, and FLOPs per token. Pure arithmetic; no devices involved.
#pragma once

#include <array>
#include <cstdint>

#include "plan/inventory.h"
#include "tensor/kv_cache_dtype.h"

namespace kestrel::plan {

enum class StateDType { kF32, kBF16 };  // KDA recurrent / conv state element type

struct StateOptions {
  KvCacheDtype kv = KvCacheDtype::kBF16;  // MLA latent cache rows, Kestrel's layouts (tensor/kv_cache_dtype.h)
  StateDType conv = StateDType::kBF16;  // vLLM keeps the conv state in the model dtype (docs/model-math.md §2.7)
  StateDType ssm = StateDType::kF32;    // recurrent state fp32 (vLLM, ours); sglang can use bf16
};

struct ComponentTotal {
  int64_t params = 0;
  int64_t bytes = 0;
  int64_t tensors = 0;
};

// Bytes of one component, split by placement.
struct PlacementBytes {
  int64_t replicated = 0, tensor = 0, expert = 0;
};

struct ModelCosts {
  std::array<ComponentTotal, kNumComponents> by_component{};
  std::array<PlacementBytes, kNumComponents> placement{};
  int64_t total_params = 0, total_bytes = 0, total_tensors = 0;

  // Routed experts.
  int moe_layers = 0, num_experts = 0, top_k = 0;
  int64_t expert_params = 0;  // one expert's three matrices
  int64_t expert_bytes = 0;   // same, in the chosen expert format
  // Parameters touched per token: everything outside routed experts, embedding and vision, plus
  // top_k experts per MoE layer (the embedding is a row gather, not a matmul).
  int64_t active_params = 0;
  int64_t dense_matmul_params = 0;  // the non-expert part of active_params

  // Shapes.
  int num_layers = 0, hidden = 0;
  int routed_width = 0;  // width of the routed experts' input (latent for LatentMoE), dispatched under EP
  int kda_layers = 0, mla_layers = 0, sparse_layers = 0;
  int attn_heads = 0, kda_heads = 0;

  // Cache, per token, all layers together.
  int64_t mla_bytes_per_token_per_layer = 0;   // one cached latent row in the cache dtype (kv_row_bytes)
  int64_t indexer_bytes_per_token_per_layer = 0;  // fp8 key + one fp32 scale per 128 elements
  int64_t cache_bytes_per_token() const {
    return mla_bytes_per_token_per_layer * mla_layers + indexer_bytes_per_token_per_layer * sparse_layers;
  }
  // Fixed per-request KDA state, all KDA layers, unsharded.
  int64_t kda_recurrent_bytes = 0;  // layers × H × K × V × elem
  int64_t kda_conv_bytes = 0;       // layers × 3 × P × (kernel − 1) × elem
  int64_t state_bytes_per_request() const { return kda_recurrent_bytes + kda_conv_bytes; }

  // FLOPs per token (multiply-add = 2). Context-dependent terms are split out so the planner can
  // place them on the right peak (bf16 vs fp8) and the right devices.
  double linear_flops = 0;  // 2 × active_params (no embedding)
  double dense_linear_flops = 0;   // 2 × dense_matmul_params
  double expert_linear_flops = 0;  // 2 × top_k × expert_params × moe_layers
  double kda_flops_prefill = 0;    // chunked form, all KDA layers
  double kda_flops_decode = 0;     // recurrent form, all KDA layers
  // Attention FLOPs of one token that sees `ctx` cached tokens.
  int mla_heads = 0, qk_dim = 0, v_dim = 0, latent = 0, kv_lora = 0;
  int index_heads = 0, index_dim = 0, index_topk = 0;
  double mla_dense_flops(double ctx, bool absorbed) const;  // all dense MLA layers
  double mla_sparse_flops(double ctx) const;                // all sparse layers, absorbed (MQA) over top-k
  double indexer_flops(double ctx) const;                   // all sparse layers (fp8 scores)
  // Averages over a prompt of length L (token t sees t tokens, causal).
  double prefill_attn_bf16_flops_avg(double L) const;
  double prefill_indexer_flops_avg(double L) const { return indexer_flops((L + 1) / 2); }
};

ModelCosts compute_costs(const ModelConfig& cfg, const Inventory& inv, const StateOptions& st);

}  // namespace kestrel::plan
