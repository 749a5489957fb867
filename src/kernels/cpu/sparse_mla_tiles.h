// The key-tile kernel of latent attention (MLA's absorbed, MQA form over cached latent rows), shared by
// sparse MLA (dsa_indexer.h: sparse_mla_attention, the rows each query selected) and dense causal MLA
// (attention.h: causal_attention, every row up to the query's position): the driver over a query's rows
// (sparse_mla_attention.cpp) and the AVX2 + FMA tile step (sparse_mla_attention_avx2.cpp). Internal to those
// files and attention.cpp.
#pragma once

#include <cstdint>

#include "kernels/cpu/dsa_indexer.h"

namespace kestrel::kernels::sparse_tiles {

inline constexpr int64_t kMaxHeadGroup = 16;  // heads of one query in one call of latent_heads

enum class Path { kScalar, kAvx2, kAvx512 };
// AVX-512 where the CPU has it, else AVX2 + FMA, else the scalar definition (the same bits on each).
Path best_path();

// Heads [h0, h0 + nh) (nh ≤ kMaxHeadGroup) of query t of a (its q, out, pages, row format, scale, Dk and Dv;
// a.idx and a.topk are not read) over the rows idx[0, count) in that order, −1 entries skipped, or over rows
// 0..count−1 when idx is null. Rows that are not fp32 are decoded once per tile for all nh heads.
void latent_heads(const SparseMlaArgs& a, int64_t t, int64_t h0, int64_t nh, const int32_t* idx, int64_t count,
                  Path path);

// One key tile (n ≤ kSparseKeyTile rows) of `heads` heads (1 or 2): queries q[g], running max m[g], sum l[g],
// outputs o[g]; the bits of the scalar definition's step for each head.
void tile_step_avx2(int heads, const float* const* q, const float* const* rows, int64_t n, const SparseMlaArgs& a,
                    float* m, float* l, float* const* o);

}  // namespace kestrel::kernels::sparse_tiles
