// Expert parallelism inside a cell (docs/cell.md): which routed experts this rank owns, the communicator
// the MoE blocks dispatch tokens over, and the bytes they moved. Set on the Binder before binding; a MoE block
// then binds only its own experts' tensors and runs its routed experts through dispatch / combine.
//
// Ownership is contiguous: with E experts over P ranks, rank r owns [E·r/P, E·(r+1)/P) (floor), so every rank
// owns ⌊E/P⌋ or ⌈E/P⌉ experts and expert ids keep their order across ranks.
#pragma once

#include <cstdint>

#include "dist/communicator.h"

namespace kestrel {

// Bytes one rank handed to all_to_all_v for other ranks (its own share, copied locally, is not counted).
struct EpTraffic {
  uint64_t count_bytes = 0;     // per-rank record counts exchanged before each dispatch
  uint64_t dispatch_bytes = 0;  // token records: K expert ids + the routed-expert input row (latent width)
  uint64_t combine_bytes = 0;   // one expert-output row per (token, expert slot) sent back to the token's owner
  uint64_t exchanges = 0;       // MoE layer calls (each is three all_to_all_v)
  uint64_t total() const { return count_bytes + dispatch_bytes + combine_bytes; }
};

struct ExpertShard {
  dist::Communicator* comm = nullptr;
  int rank = 0;
  int size = 1;
  EpTraffic traffic;  // accumulated by every MoE block of the model

  int64_t first(int64_t num_experts, int r) const { return num_experts * r / size; }
  bool owns(int64_t e, int64_t num_experts) const {
    return e >= first(num_experts, rank) && e < first(num_experts, rank + 1);
  }
  int owner(int64_t e, int64_t num_experts) const {
    // The largest r with first(r) <= e.
    int r = static_cast<int>(e * size / num_experts);
    while (r + 1 < size && first(num_experts, r + 1) <= e) ++r;
    while (r > 0 && first(num_experts, r) > e) --r;
    return r;
  }
};

}  // namespace kestrel
