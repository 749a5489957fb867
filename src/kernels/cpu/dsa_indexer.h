// DeepSeek Sparse Attention (DSA) kernels: the lightning indexer (DeepSeek-V3.2,
// docs/model-math.md §6.3) and sparse MLA attention over gathered latent rows (§6.5).
//
// Indexer key cache row (one per token per sparse layer), `indexer_row_bytes(D)` bytes:
//   [ D × e4m3 codes (Hadamard-rotated, quantized key) | fp32 scale ]       (132 B for D = 128)
// Rows live in fixed-size pages (page j / page_tokens, row j % page_tokens), like the MLA latents.
//
// Score of query t against key s (reference fp8_index): I[t,s] = kscale[s] · Σ_h w[t,h] · ReLU(q8[t,h]·k8[s])
// where q8/k8 are the raw e4m3 values and w already folds weights_proj · H^-0.5 · D^-0.5 · qscale[t,h].
// Top-k never materialises an L×L (or T×L) score matrix: each query keeps a bounded heap while
// keys stream through in tiles.
#pragma once

#include <cstdint>

#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cpu/kv_row.h"

namespace kestrel::kernels {

inline int64_t indexer_row_bytes(int64_t D) { return D + 4; }

// In-place orthonormal Walsh–Hadamard transform (Sylvester / natural order, like
// fast_hadamard_transform.hadamard_transform(x, scale = n^-0.5)); n must be a power of two.
void hadamard_rotate(float* x, int64_t n);

// NeoX ("rotate half") RoPE on x[0:rope): pairs (i, i + rope/2) rotated by pos · inv_freq[i], cos and
// sin scaled by `mag` (YaRN cos/sin magnitude; 1 for plain RoPE).
void rope_neox(float* x, int64_t rope, int64_t pos, const float* inv_freq, float mag = 1.0f);

struct IndexerTopkArgs {
  int64_t T = 0, L = 0, H = 0, D = 0, topk = 0;
  const uint8_t* q = nullptr;  // [T, H, D] e4m3 codes
  const float* w = nullptr;    // [T, H] folded head weights (see above)
  const uint8_t* const* pages = nullptr;  // key rows (layout above)
  int64_t page_tokens = 0;
  // Output [T, topk]: query t (absolute position L-T+t) selects among keys 0..L-T+t; the selected
  // positions are written in ascending order, then -1 for unused slots (when fewer than topk keys
  // are visible). Ties in score keep the lower position.
  int32_t* out = nullptr;
};
void indexer_topk(const IndexerTopkArgs& a);

// Scores of one query against keys 0..n-1 (no top-k), for tests: scores[n].
void indexer_scores_reference(const IndexerTopkArgs& a, int64_t t, int64_t n, float* scores);

// Sparse MLA in MQA form (absorbed): every head of query t attends only to the latent rows listed in
// idx[t, :] (−1 entries skipped). Latent rows in pages (token j at page j / page_tokens, row
// j % page_tokens, each row.bytes() bytes in row.dtype, decoded on load when not fp32, once per group of
// heads of a query, kv_row.h); keys are the first Dk elements of each row, values the first Dv.
// The list idx[t, :] is cut into spans at fixed list positions (at least 512 entries each, at most 16 spans:
// sparse_mla_tiles.h); in each span the selected rows are taken in tiles of kSparseKeyTile (in idx order, −1
// skipped): per head and tile, the scores (16-lane fma dot in a fixed lane-sum tree, times scale), one
// online-softmax step (a rescale of the output when the tile raises the running max, prefill_exp of each score
// minus the max, summed in order), then the output += the tile's weighted values, key by key
// (sparse_mla_attention.cpp); the spans' states are then merged in list order (latent_spans.cpp).
inline constexpr int64_t kSparseKeyTile = 16;
struct SparseMlaArgs {
  int64_t T = 0, H = 0, Dk = 0, Dv = 0, topk = 0;
  const float* q = nullptr;  // [T, H, Dk]
  const uint8_t* const* pages = nullptr;
  int64_t page_tokens = 0;
  KvRowFormat row;
  const int32_t* idx = nullptr;  // [T, topk]
  float scale = 1.0f;
  float* out = nullptr;  // [T, H, Dv]
};
// AVX-512 where the CPU has it, else AVX2 + FMA, else the scalar definition; the same bits on every path.
void sparse_mla_attention(const SparseMlaArgs& a);
// The same in scalar code: the test oracle (bit for bit) and the path on CPUs with neither AVX-512 nor AVX2.
void sparse_mla_attention_reference(const SparseMlaArgs& a);
// The AVX2 + FMA path whatever else the CPU has (so it is tested on AVX-512 CPUs too); fails (KCHECK) on a CPU
// without AVX2 + FMA.
void sparse_mla_attention_avx2(const SparseMlaArgs& a);
bool sparse_mla_attention_avx2_supported();

}  // namespace kestrel::kernels
