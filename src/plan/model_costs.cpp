#include "plan/model_costs.h"

#include <algorithm>

namespace kestrel::plan {
namespace {

int64_t elem_bytes(StateDType d) { return d == StateDType::kF32 ? 4 : 2; }

// KDA FLOPs per head per token (head dims K = V = D). Chunked prefill (chunk C = 64, WY form):
// output from the carried state (2·K·V) and state update (2·K·V) + the WY correction (2·K·V), the
// intra-chunk q·kᵀ and a·v products (2·C·(K+V)) and the triangular solve (≈ 2·C·K). Recurrent decode:
// decay (K·V), Sᵀk (2·K·V), rank-1 update (2·K·V), output (2·K·V). These are small next to the
// projections (< 1 % for K3) and are approximations, not kernel counts.
constexpr double kChunk = 64;
double kda_prefill_per_head(double D) { return 6 * D * D + 2 * kChunk * (2 * D) + 2 * kChunk * D; }
double kda_decode_per_head(double D) { return 7 * D * D; }

}  // namespace

double ModelCosts::mla_dense_flops(double ctx, bool absorbed) const {
  const int dense = mla_layers - sparse_layers;
  // expanded: per head q·k over qk_dim and p·v over v_dim; absorbed (MQA): q·k over the 576-wide
  // latent and p·v over the 512-wide c_kv.
  const double per_head = absorbed ? static_cast<double>(latent + kv_lora) : static_cast<double>(qk_dim + v_dim);
  return 2.0 * mla_heads * per_head * ctx * dense;
}

double ModelCosts::mla_sparse_flops(double ctx) const {
  return 2.0 * mla_heads * static_cast<double>(latent + kv_lora) * std::min<double>(ctx, index_topk) * sparse_layers;
}

double ModelCosts::indexer_flops(double ctx) const { return 2.0 * index_heads * index_dim * ctx * sparse_layers; }

double ModelCosts::prefill_attn_bf16_flops_avg(double L) const {
  double sparse = 0;
  if (sparse_layers > 0) {  // mean over t = 1..L of min(t, K) keys
    const double K = index_topk;
    const double mean_keys = L <= K ? (L + 1) / 2 : (K * (K + 1) / 2 + (L - K) * K) / L;
    sparse = mla_sparse_flops(mean_keys);
  }
  return mla_dense_flops((L + 1) / 2, /*absorbed=*/false) + sparse + kda_flops_prefill;
}

ModelCosts compute_costs(const ModelConfig& cfg, const Inventory& inv, const StateOptions& st) {
  const TextConfig& t = cfg.text;
  ModelCosts m;
  for (const TensorEntry& e : inv.tensors) {
    const int c = static_cast<int>(e.component);
    m.by_component[static_cast<size_t>(c)].params += e.params * e.copies;
    m.by_component[static_cast<size_t>(c)].bytes += e.bytes();
    m.by_component[static_cast<size_t>(c)].tensors += e.copies;
    PlacementBytes& p = m.placement[static_cast<size_t>(c)];
    (e.placement == Placement::kReplicated ? p.replicated : e.placement == Placement::kTensor ? p.tensor : p.expert) +=
        e.bytes();
    m.total_params += e.params * e.copies;
    m.total_bytes += e.bytes();
    m.total_tensors += e.copies;
  }
  for (size_t l = 0; l < t.ffn_kind.size(); ++l) m.moe_layers += t.ffn_kind[l] == FfnKind::kMoe ? 1 : 0;
  for (size_t l = 0; l < t.attn_kind.size(); ++l) (t.attn_kind[l] == AttnKind::kMla ? m.mla_layers : m.kda_layers)++;
  m.sparse_layers = static_cast<int>(t.sparse_attn_layers.size());
  m.top_k = m.moe_layers > 0 ? t.num_experts_per_token : 0;
  m.num_experts = m.moe_layers > 0 ? t.num_experts : 0;
  if (m.moe_layers > 0) {
    const auto& ex = m.by_component[static_cast<int>(Component::kRoutedExperts)];
    const int64_t n = static_cast<int64_t>(m.moe_layers) * m.num_experts;
    m.expert_params = ex.params / n;
    m.expert_bytes = ex.bytes / n;
  }
  for (Component c : {Component::kLmHead, Component::kNorms, Component::kKda, Component::kMla, Component::kIndexer,
                      Component::kDenseMlp, Component::kRouter, Component::kLatentProj, Component::kSharedExperts})
    m.dense_matmul_params += m.by_component[static_cast<size_t>(c)].params;
  m.active_params = m.dense_matmul_params + static_cast<int64_t>(m.top_k) * m.expert_params * m.moe_layers;
  m.dense_linear_flops = 2.0 * static_cast<double>(m.dense_matmul_params);
  m.expert_linear_flops = 2.0 * static_cast<double>(m.top_k) * static_cast<double>(m.expert_params) * m.moe_layers;
  m.linear_flops = m.dense_linear_flops + m.expert_linear_flops;

  m.num_layers = t.num_hidden_layers;
  m.hidden = t.hidden_size;
  m.routed_width = t.latent_moe() ? t.routed_expert_hidden_size : t.hidden_size;
  m.attn_heads = t.num_attention_heads;
  m.kda_heads = t.linear_attn.num_heads;
  m.mla_heads = t.num_attention_heads;
  m.qk_dim = t.qk_head_dim();
  m.v_dim = t.v_head_dim;
  m.kv_lora = t.kv_lora_rank;
  m.latent = t.kv_lora_rank + t.qk_rope_head_dim;
  m.index_heads = t.index_n_heads;
  m.index_dim = t.index_head_dim;
  m.index_topk = t.index_topk;

  // Cache per token: MLA latent rows [c_kv | k_r] (docs/model-math.md §2.7); indexer keys in fp8 with
  // one fp32 scale per 128 elements (docs/model-math.md §6.4: 128 + 4 = 132 B for DeepSeek-V3.2).
  m.mla_bytes_per_token_per_layer = kv_row_bytes(st.kv, t.kv_lora_rank, t.qk_rope_head_dim);
  if (m.sparse_layers > 0)
    m.indexer_bytes_per_token_per_layer = m.index_dim + 4 * ((static_cast<int64_t>(m.index_dim) + 127) / 128);

  const int64_t H = t.linear_attn.num_heads, D = t.linear_attn.head_dim, P = H * D;
  const int64_t hist = std::max(0, t.linear_attn.short_conv_kernel_size - 1);
  m.kda_recurrent_bytes = static_cast<int64_t>(m.kda_layers) * H * D * D * elem_bytes(st.ssm);
  m.kda_conv_bytes = static_cast<int64_t>(m.kda_layers) * 3 * P * hist * elem_bytes(st.conv);
  m.kda_flops_prefill = static_cast<double>(m.kda_layers) * H * kda_prefill_per_head(static_cast<double>(D));
  m.kda_flops_decode = static_cast<double>(m.kda_layers) * H * kda_decode_per_head(static_cast<double>(D));
  return m;
}

}  // namespace kestrel::plan
