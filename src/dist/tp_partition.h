// Tensor parallelism of the dense FFN work inside a cell (docs/cell.md §7): which slice of a gated MLP's
// intermediate columns a rank of a TP group owns. TP groups are T consecutive ranks; rank r is member r mod T
// of the group starting at r − r mod T. The intermediate dimension I is cut on the weight format's block
// boundaries (1 for float weights, 128 for DeepSeek FP8 blocks) with the blocks shared as evenly as they go:
// member j of T owns blocks [⌊nb·j/T⌋, ⌊nb·(j+1)/T⌋) of the nb = ⌈I/block⌉ blocks (the last block may be
// partial), so a member can own nothing when there are fewer blocks than members. One definition for weight
// binding (layers/ffn.cpp) and for `kestrel plan --cell --tp` (plan/cell_plan.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace kestrel::dist {

// [begin, end) of the intermediate columns member j of a TP group of `tp` owns.
inline std::pair<int64_t, int64_t> tp_slice(int64_t inter, int64_t block, int tp, int j) {
  const int64_t nb = (inter + block - 1) / block;
  const int64_t b0 = nb * j / tp, b1 = nb * (j + 1) / tp;
  return {std::min(inter, b0 * block), std::min(inter, b1 * block)};
}

inline int tp_group_first(int rank, int tp) { return rank - rank % tp; }

}  // namespace kestrel::dist
