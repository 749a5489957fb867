#include "kernels/cpu/attention.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

#include <algorithm>
#include <cmath>

namespace kestrel::kernels {

namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
// One-op unaligned load (std::memcpy into a v16 goes through the stack in two halves with GCC 12).
typedef float v16_alias __attribute__((vector_size(64), aligned(4), may_alias));
inline v16 load16(const float* p) { return *reinterpret_cast<const v16_alias*>(p); }

// q·k in 16-lane partial sums (two independent accumulators, then the lanes in order, then the
// scalar tail): a plain running sum is one long FMA dependency chain GCC may not reorder.
inline float dot(const float* q, const float* k, int64_t n) {
  v16 a0{}, a1{};
  int64_t d = 0;
  for (; d + 32 <= n; d += 32) {
    a0 += load16(q + d) * load16(k + d), a1 += load16(q + d + 16) * load16(k + d + 16);
  }
  for (; d + 16 <= n; d += 16) {
    a0 += load16(q + d) * load16(k + d);
  }
  a0 += a1;
  float s = 0;
  for (int i = 0; i < 16; ++i) s += a0[i];
  for (; d < n; ++d) s += q[d] * k[d];
  return s;
}

// Online softmax (running max and sum, rescaling the accumulator): one pass over the keys and no
// buffer that grows with the context length. Query t, head h.
void attend_one(const AttentionArgs& a, int64_t t, int64_t h) {
  const int64_t offset = a.L - a.T;
  const float* q = a.q + (t * a.H + h) * a.Dk;
  float* o = a.out + (t * a.H + h) * a.Dv;
  std::fill(o, o + a.Dv, 0.0f);
  const int64_t n = offset + t + 1;
  const int64_t row_bytes = a.pages ? a.row.bytes() : 0, row_n = std::max(a.Dk, a.Dv);
  float* buf = a.pages && a.row.dtype != KvCacheDtype::kF32 ? thread_scratch(kScratchKvRow, static_cast<size_t>(row_n))
                                                            : nullptr;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float* row =
        a.pages ? kv_row_floats(a.row, a.pages[j / a.page_tokens] + (j % a.page_tokens) * row_bytes, row_n, buf) : nullptr;
    const float* k = row ? row : a.k + j * a.k_token_stride + h * a.k_head_stride;
    const float s = dot(q, k, a.Dk) * a.scale;
    if (s > m) {
      const float r = std::exp(m - s);  // 0 on the first key
      l *= r;
      for (int64_t d = 0; d < a.Dv; ++d) o[d] *= r;
      m = s;
    }
    const float w = std::exp(s - m);
    l += w;
    const float* v = row ? row : a.v + j * a.v_token_stride + h * a.v_head_stride;
    for (int64_t d = 0; d < a.Dv; ++d) o[d] += w * v[d];
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < a.Dv; ++d) o[d] *= inv;
}

}  // namespace

void causal_attention(const AttentionArgs& a) {
  if (a.H <= 0) return;
  parallel_for(0, a.T * a.H, 1, true, [&](int64_t i) { attend_one(a, i / a.H, i % a.H); });
}

void causal_attention_many(std::span<const AttentionArgs> args) {
  int64_t total = 0;
  for (const AttentionArgs& a : args) total += a.T * a.H;
  parallel_for_dynamic(total, 4, [&](int64_t i) {
    size_t s = 0;
    int64_t r = i;
    while (r >= args[s].T * args[s].H) {
      r -= args[s].T * args[s].H;
      ++s;
    }
    attend_one(args[s], r / args[s].H, r % args[s].H);
  });
}

}  // namespace kestrel::kernels
