// Latent attention's spans (sparse_mla_tiles.h): the merge of span states in list order and the work split of
// a call's queries. Compiled with -ffp-contract=off (src/kernels/CMakeLists.txt): only the fmas written here are
// fused, so the merge has the same bits in every form below.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/exp_lanes.h"
#include "kernels/cpu/kv_row.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/sparse_mla_tiles.h"

namespace kestrel::kernels::sparse_tiles {
namespace {

// O[d] = fma(o[d], b, O[d] · a) for d < n, in three forms with the same bits.
__attribute__((target("avx512f"))) void merge_rows_avx512(float* O, const float* o, float a, float b, int64_t n) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 k = n - d >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - d)) - 1);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, O + d), va);
    _mm512_mask_storeu_ps(O + d, k, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, o + d), vb, x));
  }
}
__attribute__((target("fma"))) void merge_rows_fma(float* O, const float* o, float a, float b, int64_t n) {
  for (int64_t d = 0; d < n; ++d) O[d] = std::fma(o[d], b, O[d] * a);
}
void merge_rows_scalar(float* O, const float* o, float a, float b, int64_t n) {
  for (int64_t d = 0; d < n; ++d) O[d] = std::fma(o[d], b, O[d] * a);
}

void normalise(float* o, float l, int64_t Dv) {
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = 0; d < Dv; ++d) o[d] *= inv;
}

// Heads [h0, h0 + nh) of one query on this thread: span 0 straight into the output, each later span into
// scratch and folded in, then normalised.
void whole_query(const LatentQuery& q, int64_t h0, int64_t nh, Path path) {
  const SparseMlaArgs& a = *q.a;
  float m[kMaxHeadGroup], l[kMaxHeadGroup], ms[kMaxHeadGroup], ls[kMaxHeadGroup];
  float* out[kMaxHeadGroup] = {};
  float* os[kMaxHeadGroup] = {};
  for (int64_t g = 0; g < nh; ++g) out[g] = a.out + (q.t * a.H + h0 + g) * a.Dv;
  const int64_t S = span_rows(q.count), spans = span_count(q.count);
  span_state(a, q.t, h0, nh, q.idx, 0, std::min(S, q.count), q.count, path, m, l, out);
  if (spans > 1) {
    float* buf = thread_scratch(kScratchLatentSpan, static_cast<size_t>(kMaxHeadGroup * a.Dv));
    for (int64_t g = 0; g < nh; ++g) os[g] = buf + g * a.Dv;
    for (int64_t k = 1; k < spans; ++k) {
      span_state(a, q.t, h0, nh, q.idx, k * S, std::min((k + 1) * S, q.count), q.count, path, ms, ls, os);
      for (int64_t g = 0; g < nh; ++g) merge_span(m[g], l[g], out[g], ms[g], ls[g], os[g], a.Dv);
    }
  }
  for (int64_t g = 0; g < nh; ++g) normalise(out[g], l[g], a.Dv);
}

}  // namespace

void merge_span(float& M, float& L, float* O, float m, float l, const float* o, int64_t Dv) {
  if (m == -INFINITY) return;  // an empty span: every entry −1
  if (M == -INFINITY) {
    M = m, L = l;
    std::copy(o, o + Dv, O);
    return;
  }
  const float x = std::max(M, m), ea = prefill_exp(M - x), eb = prefill_exp(m - x);
  L = std::fma(l, eb, L * ea);
  static const int form = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("fma") ? 1 : 0;
  if (form == 2) merge_rows_avx512(O, o, ea, eb, Dv);
  else if (form == 1) merge_rows_fma(O, o, ea, eb, Dv);
  else merge_rows_scalar(O, o, ea, eb, Dv);
  M = x;
}

std::vector<LatentQuery>& query_scratch(size_t n) { return thread_table<LatentQuery, struct Queries>(n); }

void attend(std::span<const LatentQuery> qs, Path path) {
  const int64_t threads = omp_get_max_threads(), nq = static_cast<int64_t>(qs.size());
  int64_t whole = 0, pairs = 0, span_pairs = 0, H = 1, widest = 0, Dv = 0;
  bool split = false;
  for (const LatentQuery& q : qs) {
    const int64_t s = span_count(q.count);
    whole += (q.a->H + kMaxHeadGroup - 1) / kMaxHeadGroup;
    pairs += q.a->H, span_pairs += s * q.a->H, split |= s > 1;
    H = std::max(H, q.a->H), Dv = std::max(Dv, q.a->Dv);
    if (q.a->row.dtype != KvCacheDtype::kF32) widest = std::max(widest, std::max(q.a->Dk, q.a->Dv));
  }
  if (pairs == 0) return;
  // Every thread sizes its buffers for the widest call as it enters, whichever items it then gets.
  auto enter = [&] {
    if (widest > 0) thread_scratch(kScratchKvRow, static_cast<size_t>(kSparseKeyTile * widest));
    thread_scratch(kScratchLatentSpan, static_cast<size_t>(kMaxHeadGroup * Dv));
  };
  std::vector<int64_t>& first = thread_table<int64_t, struct Items>(2 * qs.size() + 2);  // item starts, then state offsets
  auto query_of = [&](int64_t i) {
    return std::upper_bound(first.begin(), first.begin() + nq + 1, i) - first.begin() - 1;
  };
  first[0] = 0;
  if (threads == 1 || !split || whole >= 2 * threads) {
    // Whole queries (or groups of their heads) per item; G spreads a few queries' heads over the threads.
    const int64_t G = std::clamp<int64_t>((pairs + threads - 1) / threads, 1, std::min(kMaxHeadGroup, H));
    for (int64_t s = 0; s < nq; ++s) first[s + 1] = first[s] + (qs[s].a->H + G - 1) / G;
    parallel_for_dynamic(first[nq], 1, enter, [&](int64_t i) {
      const int64_t s = query_of(i), h0 = (i - first[s]) * G;
      whole_query(qs[s], h0, std::min(G, qs[s].a->H - h0), path);
    });
    return;
  }
  // Few queries with long lists: items are (query, span, group of G heads); each span's state is kept (m, l,
  // then Dv outputs per head), then every head folds its spans in order.
  const int64_t G = std::clamp<int64_t>(span_pairs / (2 * threads), 1, std::min(kMaxHeadGroup, H));
  size_t floats = 0;
  for (int64_t s = 0; s < nq; ++s) {
    const int64_t spans = span_count(qs[s].count), groups = (qs[s].a->H + G - 1) / G;
    first[s + 1] = first[s] + spans * groups;
    floats += static_cast<size_t>(kMaxSpans * qs[s].a->H * (qs[s].a->Dv + 2));
  }
  float* state = thread_table<float, struct SpanStates>(floats).data();
  int64_t* off = first.data() + nq + 1;
  off[0] = 0;
  for (int64_t s = 0; s < nq; ++s) off[s + 1] = off[s] + span_count(qs[s].count) * qs[s].a->H * (qs[s].a->Dv + 2);
  parallel_for_dynamic(first[nq], 1, enter, [&](int64_t i) {
    const int64_t s = query_of(i);
    const LatentQuery& q = qs[s];
    const SparseMlaArgs& a = *q.a;
    const int64_t groups = (a.H + G - 1) / G, k = (i - first[s]) / groups, h0 = (i - first[s]) % groups * G;
    const int64_t nh = std::min(G, a.H - h0), S = span_rows(q.count), end = std::min((k + 1) * S, q.count);
    float m[kMaxHeadGroup], l[kMaxHeadGroup];
    float* o[kMaxHeadGroup] = {};
    float* at = state + off[s] + (k * a.H + h0) * (a.Dv + 2);
    for (int64_t g = 0; g < nh; ++g) o[g] = at + g * (a.Dv + 2) + 2;
    span_state(a, q.t, h0, nh, q.idx, k * S, end, end, path, m, l, o);
    for (int64_t g = 0; g < nh; ++g) at[g * (a.Dv + 2)] = m[g], at[g * (a.Dv + 2) + 1] = l[g];
  });
  for (int64_t s = 0; s < nq; ++s) first[s + 1] = first[s] + qs[s].a->H;
  parallel_for_dynamic(first[nq], 1, [&](int64_t i) {
    const int64_t s = query_of(i), h = i - first[s];
    const LatentQuery& q = qs[s];
    const SparseMlaArgs& a = *q.a;
    float M = -INFINITY, L = 0.0f;
    float* O = a.out + (q.t * a.H + h) * a.Dv;
    std::fill(O, O + a.Dv, 0.0f);
    for (int64_t k = 0; k < span_count(q.count); ++k) {
      const float* at = state + off[s] + (k * a.H + h) * (a.Dv + 2);
      merge_span(M, L, O, at[0], at[1], at + 2, a.Dv);
    }
    normalise(O, L, a.Dv);
  });
}

}  // namespace kestrel::kernels::sparse_tiles
