// Causal softmax attention, fp32 arithmetic, one sequence. One kernel serves both MLA forms:
//   expanded (prefill): per-head keys/values [L, H, D]        → k_head_stride = D
//   absorbed (decode):  one shared 576-wide latent key row; values are its first 512 entries
//                       → k_head_stride = v_head_stride = 0 (MQA)
// Queries are the LAST T of the L positions: query t (absolute L-T+t) attends keys 0..L-T+t.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/kv_row.h"

namespace kestrel::kernels {

struct AttentionArgs {
  int64_t T = 0, L = 0, H = 0, Dk = 0, Dv = 0;
  const float* q = nullptr;  // [T, H, Dk]
  const float* k = nullptr;  // element (j, h, d) at k[j*k_token_stride + h*k_head_stride + d]
  int64_t k_token_stride = 0, k_head_stride = 0;
  const float* v = nullptr;  // element (j, h, d) at v[j*v_token_stride + h*v_head_stride + d]
  int64_t v_token_stride = 0, v_head_stride = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [T, H, Dv]
  // Paged latent rows (optional, the absorbed form): when set, k, v and their strides are unused; token
  // j's row is at pages[j / page_tokens] + (j % page_tokens) · row.bytes(), stored in row.dtype; every
  // head's key is the row's first Dk elements and its value the first Dv (MQA). Rows that are not fp32
  // are decoded on load (kv_row.h), each once per group of heads of a query (up to 8, fewer when the
  // groups would leave threads idle); fp32 rows are read in place.
  const uint8_t* const* pages = nullptr;
  int64_t page_tokens = 0;
  KvRowFormat row;
};

void causal_attention(const AttentionArgs& a);
// Several independent attentions (the decode segments of a batch) in one parallel region.
void causal_attention_many(std::span<const AttentionArgs> args);

}  // namespace kestrel::kernels
