// The weighted combine of routed-expert outputs, shared by every MoE execution path (grouped, fused,
// cell) so each performs the same floating-point operations (same contraction into FMA or not) in the
// same per-token order, ascending expert id, and gives the same bits.
#pragma once

#include <cstdint>

namespace kestrel {

// dst[d] += w · src[d] for d < n: one expert's weighted output added to a token's accumulator.
[[gnu::noinline]] inline void add_weighted(float* dst, const float* src, float w, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] += w * src[d];
}

}  // namespace kestrel
