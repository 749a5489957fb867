#include "kernels/cpu/attention.h"

#include "kernels/cpu/online_softmax.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kestrel::kernels {

namespace {

constexpr int64_t kMaxHeadGroup = 8;  // heads per work item over decoded rows (head_group)

// The per-thread buffer of one decoded row and a head group's running max and sum (attend_heads_decoded),
// sized for the largest group so it does not grow with the batch (0: rows read in place).
size_t decoded_row_floats(const AttentionArgs& a) {
  if (!a.pages || a.row.dtype == KvCacheDtype::kF32) return 0;
  return static_cast<size_t>(std::max(a.Dk, a.Dv) + 2 * kMaxHeadGroup);
}

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
// buffer that grows with the context length. Query t, head h; keys and values in place (fp32 rows).
void attend_one(const AttentionArgs& a, int64_t t, int64_t h) {
  const int64_t offset = a.L - a.T;
  const float* q = a.q + (t * a.H + h) * a.Dk;
  float* o = a.out + (t * a.H + h) * a.Dv;
  std::fill(o, o + a.Dv, 0.0f);
  const int64_t n = offset + t + 1;
  const int64_t row_bytes = a.pages ? a.row.bytes() : 0;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float* row =
        a.pages ? reinterpret_cast<const float*>(a.pages[j / a.page_tokens] + (j % a.page_tokens) * row_bytes) : nullptr;
    const float* k = row ? row : a.k + j * a.k_token_stride + h * a.k_head_stride;
    const float s = dot(q, k, a.Dk) * a.scale;
    const float* v = row ? row : a.v + j * a.v_token_stride + h * a.v_head_stride;
    online_softmax_step(s, m, l, o, v, a.Dv);
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < a.Dv; ++d) o[d] *= inv;
}

// Heads [h0, h0 + nh) of query t over paged rows that are not fp32: each row is decoded once for the
// group, then every head runs exactly attend_one's operations on it, in the same order (so each head's
// result is the one a group of one gives).
void attend_heads_decoded(const AttentionArgs& a, int64_t t, int64_t h0, int64_t nh) {
  const int64_t n = a.L - a.T + t + 1, row_bytes = a.row.bytes(), row_n = std::max(a.Dk, a.Dv);
  float* row = thread_scratch(kScratchKvRow, decoded_row_floats(a));
  float* m = row + row_n;
  float* l = m + nh;
  for (int64_t g = 0; g < nh; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f;
    float* o = a.out + (t * a.H + h0 + g) * a.Dv;
    std::fill(o, o + a.Dv, 0.0f);
  }
  for (int64_t j = 0; j < n; ++j) {
    kv_load_row(a.row, a.pages[j / a.page_tokens] + (j % a.page_tokens) * row_bytes, row_n, row);
    for (int64_t g = 0; g < nh; ++g) {
      const float* q = a.q + (t * a.H + h0 + g) * a.Dk;
      float* o = a.out + (t * a.H + h0 + g) * a.Dv;
      online_softmax_step(dot(q, row, a.Dk) * a.scale, m[g], l[g], o, row, a.Dv);
    }
  }
  for (int64_t g = 0; g < nh; ++g) {
    const float inv = 1.0f / l[g];
    float* o = a.out + (t * a.H + h0 + g) * a.Dv;
    for (int64_t d = 0; d < a.Dv; ++d) o[d] *= inv;
  }
}

// Heads per work item: 1 when the rows are read in place; for decoded rows as many (up to kMaxHeadGroup) as
// still leave two work items per thread among `items` (query, head) pairs, so a row is decoded once per group.
int64_t head_group(const AttentionArgs& a, int64_t items) {
  if (!a.pages || a.row.dtype == KvCacheDtype::kF32) return 1;
  const int64_t threads = omp_get_max_threads();
  return std::clamp<int64_t>(items / (2 * threads), 1, std::min<int64_t>(kMaxHeadGroup, a.H));
}

// Work item i of one attention: query i / groups, heads of group i % groups.
void attend_item(const AttentionArgs& a, int64_t G, int64_t i) {
  const int64_t groups = (a.H + G - 1) / G, t = i / groups, h0 = (i % groups) * G;
  if (G == 1 && (!a.pages || a.row.dtype == KvCacheDtype::kF32)) return attend_one(a, t, h0);
  attend_heads_decoded(a, t, h0, std::min(G, a.H - h0));
}

int64_t items_of(const AttentionArgs& a, int64_t G) { return a.T * ((a.H + G - 1) / G); }

// Per-call head-group sizes of causal_attention_many (grows only: steady decode allocates nothing).
std::vector<int64_t>& group_scratch(size_t n) {
  thread_local std::vector<int64_t> g;
  if (g.size() < n) g.resize(n);
  return g;
}

}  // namespace

void causal_attention(const AttentionArgs& a) {
  if (a.H <= 0) return;
  const int64_t G = head_group(a, a.T * a.H);
  parallel_for(0, items_of(a, G), 1, true, [&](int64_t i) { attend_item(a, G, i); });
}

void causal_attention_many(std::span<const AttentionArgs> args) {
  int64_t pairs = 0;
  for (const AttentionArgs& a : args) pairs += a.T * a.H;
  std::vector<int64_t>& groups = group_scratch(args.size());
  int64_t total = 0;
  for (size_t s = 0; s < args.size(); ++s) total += items_of(args[s], groups[s] = head_group(args[s], pairs));
  auto item = [&](int64_t i) {
    size_t s = 0;
    int64_t r = i;
    while (r >= items_of(args[s], groups[s])) {
      r -= items_of(args[s], groups[s]);
      ++s;
    }
    attend_item(args[s], groups[s], r);
  };
  // Every thread sizes its row buffer for the widest call as it enters, whichever items it then gets.
  size_t floats = 0;
  for (const AttentionArgs& a : args) floats = std::max(floats, decoded_row_floats(a));
  parallel_for_dynamic(total, 4, [&] { if (floats > 0) thread_scratch(kScratchKvRow, floats); }, item);
}

}  // namespace kestrel::kernels
