// AVX-512 VNNI path (vpdpbusd). Per 128-element chunk of a row: one 64-byte load of packed weights;
// low nibbles are the chunk's even elements, high nibbles its odd ones, matching the activations'
// SIMD order (w4a8_format.h), so lane i of dpbusd(lo, x_even) + dpbusd(hi, x_odd) is the sum over
// packed word i. Accumulators start at −c·Σx per word (the u8-offset compensation), are converted to
// fp32 per chunk and scaled by each lane's group scale. Register block: R rows × U tokens.
// Compiled for AVX-512 by function attributes only; the dispatcher calls it only when supported.
// GCC 12 false positive: its AVX-512 headers build "undefined" vectors from a self-initialised local
// (__Y), which -Wmaybe-uninitialized reports inside every inlined intrinsic (GCC PR105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/w4a8_avx512_lanes.h"
#include "kernels/cpu/w4a8_kernels.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

using w4a8_lanes::chunk_scales;
using w4a8_lanes::neg_comp;
using w4a8_lanes::neg_comp128;
using w4a8_lanes::scale_at;
using w4a8_lanes::unpack;
using w4a8_lanes::unpack_lo128;

// pf (the first token block of these rows): prefetch the next register blocks' rows (int8_prefetch_ahead).
template <Int8Weights K, int R, int U>
KESTREL_AVX512 void block(const Int8GemmTask& t, int64_t r0, int64_t n0, __m512i idx, bool pf) {
  const QuantizedActs& a = *t.acts;
  const int64_t in = t.in, full = in / 128, tails = (in - full * 128) / 32;
  const int64_t G = K == Int8Weights::kInt4 ? t.group : 32, groups = in / G;
  const int64_t sbytes = K == Int8Weights::kInt4 ? 2 : 1;
  const uint8_t* W[R];
  const uint8_t* S[R];
  for (int r = 0; r < R; ++r) W[r] = t.packed + (r0 + r) * (in / 2), S[r] = t.scales + (r0 + r) * groups * sbytes;
  const int8_t* X[U];
  const int32_t* WS[U];
  for (int u = 0; u < U; ++u) X[u] = a.qp.data() + (n0 + u) * in, WS[u] = a.wsum.data() + (n0 + u) * (in / 8);
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < full; ++c) {
    __m512i xe[U], xo[U], nc[U];
    for (int u = 0; u < U; ++u) {
      xe[u] = _mm512_loadu_si512(X[u] + c * 128);
      xo[u] = _mm512_loadu_si512(X[u] + c * 128 + 64);
      nc[u] = neg_comp<K>(_mm512_loadu_si512(WS[u] + c * 16));
    }
    const int64_t sc0 = c * 128 / G * sbytes;  // this chunk's first scale byte in the row
    const bool scale_line = sc0 % 64 < 128 / G * sbytes;
    for (int r = 0; r < R; ++r) {
      if (pf) {
        int8_prefetch_ahead(W[r] + c * 64, R * (in / 2));
        if (scale_line) int8_prefetch_ahead(S[r] + sc0, R * groups * sbytes);
      }
      __m512i lo, hi;
      unpack<K>(_mm512_loadu_si512(W[r] + c * 64), lo, hi);
      const __m512 sc = chunk_scales<K>(S[r], c, G, idx);
      for (int u = 0; u < U; ++u) {
        const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(nc[u], lo, xe[u]), hi, xo[u]);
        acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[r][u]);
      }
    }
  }
  __m128 tacc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) tacc[r][u] = _mm_setzero_ps();
  for (int64_t j = 0; j < tails; ++j) {  // 32-element chunks after the last full 128
    const int64_t e0 = full * 128 + j * 32;
    __m128i xe[U], xo[U], nc[U];
    for (int u = 0; u < U; ++u) {
      xe[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(X[u] + e0));
      xo[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(X[u] + e0 + 16));
      nc[u] = neg_comp128<K>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(WS[u] + e0 / 8)));
    }
    for (int r = 0; r < R; ++r) {
      __m128i hi;
      const __m128i lo = unpack_lo128<K>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W[r] + e0 / 2)), hi);
      const __m128 sc = _mm_set1_ps(scale_at<K>(S[r], e0 / G));
      for (int u = 0; u < U; ++u) {
        const __m128i d = _mm_dpbusd_epi32(_mm_dpbusd_epi32(nc[u], lo, xe[u]), hi, xo[u]);
        tacc[r][u] = _mm_fmadd_ps(_mm_cvtepi32_ps(d), sc, tacc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      const float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][u], _mm512_zextps128_ps512(tacc[r][u])));
      t.y[(n0 + u) * t.ldy + r0 + r] = s * a.scale[static_cast<size_t>(n0 + u)];
    }
}

template <Int8Weights K, int R>
KESTREL_AVX512 void rows(const Int8GemmTask& t, int64_t r0, __m512i idx) {
  // MXFP4 needs more live registers per row (table, E8M0 decode constants): 2 tokens per block
  // keeps the R × U accumulators and operands inside the 32 zmm registers.
  constexpr int U = K == Int8Weights::kMxfp4 ? 2 : 4;
  const int64_t T = t.acts->T;
  int64_t n = 0;
  for (; n + U <= T; n += U) block<K, R, U>(t, r0, n, idx, n == 0);
  for (; n < T; ++n) block<K, R, 1>(t, r0, n, idx, n == 0);
}

template <Int8Weights K>
KESTREL_AVX512 void run(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  // Lane i of a chunk covers word i (elements 8i..8i+7), whose group is i·8/G within the chunk.
  const int shift = K == Int8Weights::kInt4 ? __builtin_ctzll(static_cast<unsigned long long>(t.group / 8)) : 2;
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = i >> shift;
  const __m512i idx = _mm512_load_si512(lane_group);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows<K, 4>(t, r, idx);
  for (; r < r1; ++r) rows<K, 1>(t, r, idx);
}

}  // namespace

KESTREL_AVX512 void int8_rows_avx512(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  if (t.kind == Int8Weights::kInt4) run<Int8Weights::kInt4>(t, r0, r1);
  else run<Int8Weights::kMxfp4>(t, r0, r1);
}

}  // namespace kestrel::kernels
