// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>

#include "base/check.h"
#include "base/env_switch.h"
#include "kernels/cpu/gguf_int8.h"
#include "tensor/dtype.h"

#define KESTREL_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

namespace kestrel::kernels {
namespace {

// R row streams. Each 64-byte step of a row is paired with a prefetch of the same step two register
// blocks (2R rows) on into L2; the hardware brings them on into L1 (unlike the int8 GEMVs, an L1
// prefetch one block ahead lost here: rows are 4× the bytes per element, and one vdpbf16ps per line
// leaves little room for extra loads). Only the first token block of a sweep prefetches: later ones find
// the rows in cache. One core, 32768 × 2304 GEMV from DRAM (AMD EPYC Zen 4): 1 KiB ahead in the row
// 14.2 GB/s, two blocks ahead 23.3 (plain sequential read 21.8); two cores 24–27 → 35 GB/s.
// pf: prefetch the next register blocks' rows (the first token block of a sweep; later ones find them in cache).
template <int R, int U>
KESTREL_AVX512BF16 void block(const uint16_t* W, int64_t in, const Bf16Acts& a, float* y, int64_t ldy, int64_t r0, int64_t t0, bool pf) {
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  const int64_t full = in / 32 * 32;
  const uint16_t* X = a.x.data() + t0 * a.stride;
  // Main loop over whole 32-element steps (no branch inside: a conditional load there made GCC keep
  // the accumulators on the stack), then the masked tail through the same instruction.
  for (int64_t i = 0; i < full; i += 32) {
    __m512bh xv[U];
    for (int u = 0; u < U; ++u) xv[u] = (__m512bh)_mm512_loadu_si512(X + u * a.stride + i);
    for (int r = 0; r < R; ++r) {
      const uint16_t* p = W + (r0 + r) * in + i;
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(p + 2 * R * in), _MM_HINT_T1);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(p);
      for (int u = 0; u < U; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], wv, xv[u]);
    }
  }
  if (full < in) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (in - full)) - 1);
    for (int r = 0; r < R; ++r) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, W + (r0 + r) * in + full);
      for (int u = 0; u < U; ++u)
        acc[r][u] = _mm512_dpbf16_ps(acc[r][u], wv, (__m512bh)_mm512_loadu_si512(X + u * a.stride + full));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][u]);
}

// Tokens [t0, t1) of rows [r0, r0 + R); t0 a multiple of 4, so the 4-token blocks are the same
// whatever the token blocking (bits do not depend on it).
template <int R>
KESTREL_AVX512BF16 void rows(const uint16_t* W, int64_t in, const Bf16Acts& a, float* y, int64_t ldy, int64_t r0,
                             int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + 4 <= t1; t += 4) block<R, 4>(W, in, a, y, ldy, r0, t, t == t0);
  for (; t < t1; ++t) block<R, 1>(W, in, a, y, ldy, r0, t, t == t0);
}

// Prefill: the rows are swept once per block of tokens whose activations fit in L2 (≈ 512 KiB), so
// each row's 4-token micro-tiles read both operands from L2 instead of streaming all T activation
// rows from L3 per row block. bf16 GEMM, T = 512, 2 threads (Zen 4; `linear_bench OUT IN 512`):
// 2048×2048 202 → 557 GFLOP/s; 7168×7168 385 → 470–484; 18432-wide inputs 240 → 401.
constexpr int64_t kActBlockBytes = 512 * 1024;

int64_t token_block(int64_t stride) { return std::max<int64_t>(4, kActBlockBytes / (2 * stride) / 4 * 4); }

}  // namespace

bool cpu_has_avx512bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has;
}

namespace {
EnvSwitch g_bf16_acts("KESTREL_BF16_ACTS", /*default_on=*/false);
}  // namespace

bool bf16_acts_opt_in() { return g_bf16_acts.on(); }

void set_bf16_acts(bool on) { g_bf16_acts.set(on); }

bool bf16_dot_applies(const WeightMatrix& w) {
  return w.format == WeightFormat::kBF16 && w.act_bf16 && gguf_int8_enabled() && cpu_has_avx512bf16();
}

void bf16_acts_prepare(Bf16Acts& a, int64_t T, int64_t in) {
  a.T = T, a.in = in, a.stride = (in + 31) / 32 * 32;
  const size_t n = static_cast<size_t>(T * a.stride);
  if (a.x.size() < n) a.x.resize(n);
}

void bf16_acts_fill(const float* x, int64_t t0, int64_t t1, Bf16Acts& a) {
  for (int64_t t = t0; t < t1; ++t) {
    uint16_t* d = a.x.data() + t * a.stride;
    for (int64_t i = 0; i < a.in; ++i) d[i] = f32_to_bf16(x[t * a.in + i]);  // RNE, NaN kept quiet: ggml_compute_fp32_to_bf16
    for (int64_t i = a.in; i < a.stride; ++i) d[i] = 0;
  }
}

KESTREL_AVX512BF16 void bf16_dot_rows(const WeightMatrix& w, const Bf16Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  KCHECK(w.format == WeightFormat::kBF16 && w.in == a.in, "bf16_dot: format or shape mismatch");
  KCHECK(cpu_has_avx512bf16(), "bf16_dot: this CPU has no AVX512-BF16");
  const auto* W = static_cast<const uint16_t*>(w.data);
  const int64_t tb = token_block(a.stride);
  for (int64_t t0 = 0; t0 < a.T; t0 += tb) {
    const int64_t t1 = std::min(a.T, t0 + tb);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows<4>(W, w.in, a, y, ldy, r, t0, t1);
    for (; r < r1; ++r) rows<1>(W, w.in, a, y, ldy, r, t0, t1);
  }
}

void bf16_dot_rows_reference(const WeightMatrix& w, const Bf16Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const auto* W = static_cast<const uint16_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < a.T; ++t) {
      float lane[16] = {};
      for (int64_t i = 0; i < a.stride; i += 32)
        for (int l = 0; l < 16; ++l)
          for (int e : {1, 0}) {  // vdpbf16ps: odd element of the pair first
            const int64_t k = i + 2 * l + e;
            const float wv = k < w.in ? bf16_to_f32(W[r * w.in + k]) : 0.0f;
            lane[l] += wv * bf16_to_f32(a.x[static_cast<size_t>(t * a.stride + k)]);
          }
      // _mm512_reduce_add_ps: halves added pairwise (8 + 8, 4 + 4, 2 + 2, 1 + 1).
      for (int n = 8; n >= 1; n /= 2)
        for (int l = 0; l < n; ++l) lane[l] += lane[l + n];
      y[t * ldy + r] = lane[0];
    }
}

}  // namespace kestrel::kernels
