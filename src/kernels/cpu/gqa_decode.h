// Causal grouped-query attention for a few queries per sequence (decode steps, short chunks), read straight from the cached rows [k of every KV head | v of every KV head]
// (layers/gqa_layer.h) in their page dtype, with the bits of the tiled prefill kernel's definition
// (prefill_attention.h): for one (query, head), keys in blocks [32b, 32b + 32) cut at the query's position,
// s_j = (fma over d from 0 of q[d]·k_j[d]) · scale, the block's max, the rescale by exp(m − m') when it grows, then
// p_j = exp(s_j − m), l += p_j and o = fma(p_j, v_j, o) for j ascending, out = o · (1 / l), with prefill_exp;
// the same sliding window (keys j ≥ max(0, p − window + 1), blocks still [32b, 32b + 32), rows below the window
// never read) and the same sink (one more key of score sinks[h] and value 0 after the last block).
// So a query gives the same bits here as in a prefill chunk: prefill + decode equals one prefill bit for bit.
//
// A work item is one (sequence, query, KV head): the query heads sharing that KV head are the lanes of the score
// products (8 per AVX2 vector: each lane's chain of fmas over d is the definition's own), so each cached key is
// read once per group instead of once per head, and no key is copied or transposed.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/kv_row.h"

namespace kestrel::kernels {

struct GqaDecodeArgs {
  int64_t T = 0, L = 0;         // queries are the last T of the L cached positions (rows 0..L−1 present)
  int64_t H = 0, G = 0, D = 0;  // query heads, key/value heads (G divides H), head width of keys and values
  const float* q = nullptr;     // [T, H, D]
  const uint8_t* const* pages = nullptr;  // row j at pages[j / page_tokens] + (j % page_tokens) · row.bytes()
  int64_t page_tokens = 0;
  KvRowFormat row;  // row.lora = 2 · G · D, row.rope = 0
  float scale = 1.0f;
  int64_t window = 0;            // keys per query, its own included (sliding window); 0 = every key up to it
  const float* sinks = nullptr;  // [H]: each query head's sink score; nullptr = none
  float* out = nullptr;          // [T, H, D]
};

// Every sequence's queries in one parallel region; items (sequence, query, KV head) taken dynamically.
void gqa_decode(std::span<const GqaDecodeArgs> seqs);
// The definition in scalar code, one (query, head) at a time: the test oracle, and the path on CPUs without
// AVX2 + FMA.
void gqa_decode_reference(const GqaDecodeArgs& a);

}  // namespace kestrel::kernels
