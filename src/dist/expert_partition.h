// Which routed experts a rank of a cell owns: contiguous blocks, rank r of P owning [E·r/P, E·(r+1)/P)
// (floor), so each rank owns ⌊E/P⌋ or ⌈E/P⌉ experts and expert ids keep their order across ranks. One
// definition for weight binding (layers/expert_shard.h) and for `kestrel plan --cell` (plan/cell_plan.h).
#pragma once

#include <cstdint>

namespace kestrel::dist {

inline int64_t first_expert(int64_t num_experts, int ranks, int rank) { return num_experts * rank / ranks; }
inline int64_t experts_of(int64_t num_experts, int ranks, int rank) {
  return first_expert(num_experts, ranks, rank + 1) - first_expert(num_experts, ranks, rank);
}
inline int expert_owner(int64_t e, int64_t num_experts, int ranks) {
  int r = static_cast<int>(e * ranks / num_experts);
  while (r + 1 < ranks && first_expert(num_experts, ranks, r + 1) <= e) ++r;
  while (r > 0 && first_expert(num_experts, ranks, r) > e) --r;
  return r;
}

}  // namespace kestrel::dist
