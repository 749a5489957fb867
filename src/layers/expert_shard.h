// Expert parallelism inside a cell (docs/cell.md): which routed experts this rank owns, the communicator
// the MoE blocks dispatch tokens over, and the bytes they moved. Set on the Binder before binding; a MoE block
// then binds only its own experts' tensors and runs its routed experts through dispatch / combine.
//
// Ownership is contiguous (dist/expert_partition.h): rank r of P owns experts [E·r/P, E·(r+1)/P).
// With tp > 1 the dense FFN work (dense layers' MLP, shared experts) is also tensor parallel over groups of
// tp consecutive ranks (dist/tp_partition.h): each rank binds its slice of the intermediate columns.
#pragma once

#include <cstdint>

#include "dist/communicator.h"
#include "dist/expert_partition.h"

namespace kestrel {

// Bytes one rank handed to all_to_all_v for other ranks (its own share, copied locally, is not counted).
struct EpTraffic {
  uint64_t count_bytes = 0;     // per-rank record counts exchanged before each dispatch
  uint64_t dispatch_bytes = 0;  // token records: K expert ids + the routed-expert input row (latent width)
  uint64_t combine_bytes = 0;   // one expert-output row per (token, expert slot) sent back to the token's owner
  uint64_t exchanges = 0;       // MoE layer calls (each is three all_to_all_v)
  // Tensor-parallel FFN (tp > 1): row counts, hidden rows gathered to the group, partial output rows returned.
  uint64_t tp_count_bytes = 0, tp_gather_bytes = 0, tp_partial_bytes = 0;
  uint64_t tp_exchanges = 0;  // TP MLP calls (each is three all_to_all_v inside the group)
  uint64_t tp_total() const { return tp_count_bytes + tp_gather_bytes + tp_partial_bytes; }
  uint64_t total() const { return count_bytes + dispatch_bytes + combine_bytes + tp_total(); }
};

struct ExpertShard {
  dist::Communicator* comm = nullptr;
  int rank = 0;
  int size = 1;
  EpTraffic traffic;  // accumulated by every MoE block (and, with tp > 1, every TP MLP) of the model
  int tp = 1;         // tensor-parallel group size for the dense FFN work; divides size

  int64_t first(int64_t num_experts, int r) const { return dist::first_expert(num_experts, size, r); }
  bool owns(int64_t e, int64_t num_experts) const {
    return e >= first(num_experts, rank) && e < first(num_experts, rank + 1);
  }
  int owner(int64_t e, int64_t num_experts) const { return dist::expert_owner(e, num_experts, size); }
};

}  // namespace kestrel
