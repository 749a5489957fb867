// `kestrel plan --cell --ep E`: what each rank of a CPU cell holds and what a decode step moves between the
// ranks (docs/cell.md). Weights are exact byte counts of the tensors each rank binds (the replicated tensors
// plus its own routed experts, dist/expert_partition.h); cache bytes follow from data-parallel attention (a
// request's MLA rows, indexer keys and KDA state live on one rank; Kestrel's CPU state is fp32); the
// communication is the expectation under uniform routing, which real routers only approximate. With --tp T the
// dense layers' MLPs and the shared experts are cut over groups of T consecutive ranks (dist/tp_partition.h):
// each rank holds its slice's bytes exactly, and a decode step adds the TP exchanges.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "loader/model_config.h"
#include "plan/inventory.h"
#include "tensor/kv_cache_dtype.h"

namespace kestrel::plan {

struct CellRankPlan {
  int rank = 0;
  int64_t experts = 0;           // routed experts per MoE layer
  int64_t weight_bytes = 0;      // replicated + this rank's routed experts
  int64_t expert_bytes = 0;      // of which routed experts
  int64_t tp_bytes = 0;          // of which this rank's slices of the tensor-parallel MLPs (--tp > 1)
  int64_t requests = 0;          // of the batch, placed round-robin
  int64_t cache_bytes = 0;       // those requests at `context` tokens: MLA + indexer rows + KDA state
};

struct CellPlan {
  int ep = 1;
  int tp = 1;
  int tp_mlps = 0;         // tensor-parallel MLPs (dense layers and shared experts), each cut over a group
  int64_t tp_full_bytes = 0;  // their whole tensors (replicated_bytes excludes them when tp > 1)
  int64_t batch = 1, context = 0;
  KvCacheDtype kv = KvCacheDtype::kF32;
  int moe_layers = 0, num_experts = 0, top_k = 0, routed_width = 0, vocab = 0;
  int64_t replicated_bytes = 0, routed_bytes = 0;  // whole model
  int64_t cache_bytes_per_token = 0, state_bytes_per_request = 0;
  std::vector<CellRankPlan> ranks;
  // One decode step of `batch` sequences (one token each), bytes sent to other ranks by all ranks together.
  double remote_ranks_per_token = 0;  // expected ranks ≠ the token's own holding ≥ 1 of its experts
  double dispatch_bytes_per_token_layer = 0, combine_bytes_per_token_layer = 0;
  double moe_step_bytes = 0;     // dispatch + combine + record counts, all MoE layers
  double count_step_bytes = 0;   // of which record counts
  double plan_step_bytes = 0;    // the step plan broadcast from rank 0
  double logits_step_bytes = 0;  // logits rows returned to rank 0
  // TP exchanges, all ranks: per MLP, counts (T−1)·8 per rank, each rank's hidden rows to the T−1 other members
  // and the same rows' partial outputs back: 2·(T−1)·hidden·4 bytes per token.
  double tp_step_bytes = 0;
  double step_bytes() const { return moe_step_bytes + plan_step_bytes + logits_step_bytes + tp_step_bytes; }
};

// checkpoint_dir: when not empty, the weight bytes come from its safetensors headers (exact for every format and
// family; what the ranks bind: vision tensors and DeepSeek's MTP layers are left out as the loaders leave them);
// otherwise from the inventory of the config (exact for Kimi checkpoints in the released layout).
// tp > 1 needs the checkpoint (the slices' bytes follow the tensors' formats).
Result<CellPlan> make_cell_plan(const ModelConfig& cfg, const std::string& checkpoint_dir, int ep, int64_t batch,
                                int64_t context, KvCacheDtype kv, int tp = 1);
std::string cell_plan_json(const CellPlan& p);
std::string cell_plan_table(const CellPlan& p);

}  // namespace kestrel::plan
