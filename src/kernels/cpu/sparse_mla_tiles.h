// The AVX2 + FMA tile step of the sparse MLA kernel (sparse_mla_attention_avx2.cpp), called by its driver
// (sparse_mla_attention.cpp). Internal to those files.
#pragma once

#include <cstdint>

#include "kernels/cpu/dsa_indexer.h"

namespace kestrel::kernels::sparse_tiles {

// One key tile (n ≤ kSparseKeyTile rows) of `heads` heads (1 or 2): queries q[g], running max m[g], sum l[g],
// outputs o[g]; the bits of the scalar definition's step for each head.
void tile_step_avx2(int heads, const float* const* q, const float* const* rows, int64_t n, const SparseMlaArgs& a,
                    float* m, float* l, float* const* o);

}  // namespace kestrel::kernels::sparse_tiles
