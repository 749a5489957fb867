// Block Attention Residuals (docs/model-math.md §2.1): a softmax-over-depth mixture of the frozen
// block sums (bank) and the current partial sum. Scores use RMSNorm WITHOUT weight on each row
// and c = res_norm.weight ⊙ res_proj.weight; the mixture is over the raw rows. fp32 throughout.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kestrel {

// rows: n source arrays, each [T, D]; c: [D]; out: [T, D] (may not alias rows).
void attn_res_mix(std::span<const float* const> rows, int64_t T, int64_t D, const float* c, float eps, float* out);

}  // namespace kestrel
