// Causal softmax attention for long prefill chunks (the expanded MLA form: per-head keys and values),
// tiled as FlashAttention-2 tiles it: a work item is one head and a block of up to 64 queries; it walks the
// keys in blocks of kKeyBlock, and every key block meets every query of the item while it is in L1, in
// register tiles of 8 queries × 32 keys (AVX-512; 4 × 32 on AVX2) for the scores and 4 queries × 64 value lanes
// for the output.
//
// The arithmetic of one (query, head) is defined by its absolute positions alone, never by the tiling:
//   keys in blocks [32b, 32b + 32), the query's last block cut at its own position p;
//   s_j   = (fma over d = 0..Dk−1 of q[d]·k_j[d], in order, from 0) · scale
//   m'    = max(m, max_j s_j); when m' > m: r = exp(m − m'), l ·= r, o ·= r (elementwise), m = m'
//   p_j   = exp(s_j − m), l += p_j (j ascending), o = fma(p_j, v_j, o) (j ascending, elementwise)
//   out   = o · (1 / l)
// with exp the one polynomial below (Cody–Waite range reduction, degree-7 Taylor, 0 under −87). So a
// query's bits do not depend on the chunk it arrives in, the batch, the thread count or the ISA path:
// prefill_attention (AVX-512 where the CPU has it, else AVX2 + FMA, else the scalar definition) equals
// prefill_attention_reference bit for bit (tested, each vector path on its own).
// Sliding window (window = W > 0): the query sees keys j ≥ lo = max(0, p − W + 1) alone (p − j < W). Its blocks
// start at the one holding lo, whose keys below lo are skipped (no part in the block max, l or o); blocks wholly
// below lo are not visited, no value below lo is read, and a work item walks only the key blocks some query of
// it sees (O(T · W) work). window = 0: every key up to p.
// Sink (sinks non-null): after the last block, query head h meets one more key of score sinks[h] (the units of s)
// and value 0: when sinks[h] > m: r = exp(m − sinks[h]), l ·= r, o ·= r, m = sinks[h]; then l += exp(sinks[h] − m),
// before out. So the sink takes its share of the softmax and adds nothing to the output.
// Grouped-query attention (kv_group > 1, a divisor of H; KCHECK): query head h reads key/value head
// h / kv_group, and computes exactly what it would with kv_group = 1 and that head copied into its own slot.
#pragma once

#include <cstdint>

namespace kestrel::kernels {

inline constexpr int64_t kKeyBlock = 32;

// Floats of one head's packed keys: ceil(L / 32) blocks of [Dk][32] (key index fastest).
inline int64_t packed_key_floats(int64_t L, int64_t Dk) { return (L + kKeyBlock - 1) / kKeyBlock * kKeyBlock * Dk; }

// Writes elements [d0, d0 + n) of key j into one head's packed keys.
inline void pack_key_part(float* kt_head, int64_t Dk, int64_t j, int64_t d0, const float* src, int64_t n) {
  float* dst = kt_head + (j / kKeyBlock) * kKeyBlock * Dk + j % kKeyBlock;
  for (int64_t d = 0; d < n; ++d) dst[(d0 + d) * kKeyBlock] = src[d];
}

// The first key the query at position pos sees (lo above): 0 without a window (window = 0).
inline int64_t window_first_key(int64_t pos, int64_t window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

struct PrefillAttentionArgs {
  int64_t T = 0, L = 0, H = 0, Dk = 0, Dv = 0;  // queries are the last T of L positions; H query heads
  const float* q = nullptr;                     // [T, H, Dk]
  const float* kt = nullptr;                    // head h at kt + (h / kv_group) · kt_head_stride, packed
  int64_t kt_head_stride = 0;                   //   (pack_key_part); what lies past L in the last block is never used
  const float* v = nullptr;                     // head h at v + (h / kv_group) · v_head_stride: [L, Dv]
  int64_t v_head_stride = 0;
  int64_t kv_group = 1;  // query heads per key/value head: query head h reads key/value head h / kv_group (GQA);
                         //   1 = one per head
  float scale = 1.0f;
  int64_t window = 0;             // keys per query, its own included (sliding window); 0 = every key up to it
  const float* sinks = nullptr;   // [H]: each query head's sink score; nullptr = none
  float* out = nullptr;           // [T, H, Dv]
};

void prefill_attention(const PrefillAttentionArgs& a);
// The definition above in scalar code, one (query, head) at a time: the test oracle and the path on CPUs
// with neither AVX-512 nor AVX2 + FMA.
void prefill_attention_reference(const PrefillAttentionArgs& a);
// The tiled kernel on its AVX2 + FMA work item (prefill_attention_avx2.cpp) whatever else the CPU has, so the
// AVX2 path is tested on AVX-512 CPUs too; fails (KCHECK) on a CPU without AVX2 + FMA.
void prefill_attention_avx2(const PrefillAttentionArgs& a);
bool prefill_attention_avx2_supported();
// The exp of the definition (x ≤ 0 in use), scalar; the AVX-512 and AVX2 lanes compute the same bits.
float prefill_exp(float x);

}  // namespace kestrel::kernels
