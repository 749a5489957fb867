// Causal attention of MLA's absorbed (MQA) form over paged latent rows, fp32 arithmetic: every head of query t
// (absolute position L−T+t) attends rows 0..L−T+t; a head's key is the row's first Dk elements, its value the
// first Dv. It runs the key-tile kernel of sparse MLA (sparse_mla_tiles.h) with every causal row selected, so
// its bits are sparse_mla_attention's (dsa_indexer.h) for idx = 0..L−T+t: a query's result does not depend on
// the other queries or sequences, the head grouping, the thread count, the split of its rows' spans over the
// threads (a lone decode query's rows are shared out that way) or the ISA path. (Long prefill chunks
// run the expanded form, prefill_attention.h.)
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/kv_row.h"

namespace kestrel::kernels {

struct AttentionArgs {
  int64_t T = 0, L = 0, H = 0, Dk = 0, Dv = 0;  // queries are the last T of L positions
  const float* q = nullptr;                     // [T, H, Dk]
  // Token j's row is at pages[j / page_tokens] + (j % page_tokens) · row.bytes(), stored in row.dtype (rows
  // that are not fp32 are decoded on load, kv_row.h, once per tile for a query's group of heads).
  const uint8_t* const* pages = nullptr;
  int64_t page_tokens = 0;
  KvRowFormat row;
  float scale = 1.0f;
  float* out = nullptr;  // [T, H, Dv]
};

void causal_attention(const AttentionArgs& a);
// Several independent attentions (the decode segments of a batch) in one parallel region.
void causal_attention_many(std::span<const AttentionArgs> args);

}  // namespace kestrel::kernels
