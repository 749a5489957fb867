// Prefill form of the AVX-512 VNNI int8-activation kernel (W4A8 int4 and MXFP4 × int8,
// w4a8_kernels.h): convert, then GEMM. A stripe of weight rows is unpacked once into a per-thread
// buffer (per (row, 128-element chunk): u8 codes ready for vpdpbusd, low and high nibbles, and the 16
// lane scales in fp32), the activations' compensation −c·Σx per word is laid out once per block of
// tokens, and a register tile of R rows × U tokens then runs, per (row, token, chunk), only
//   p = dpbusd(dpbusd(−c·Σx, lo, x_even), hi, x_odd);  acc = fma(float(p), scale, acc)
// which is what the small-T kernel (w4a8_avx512.cpp) does after its per-row unpack, with the same
// lane values (the unpack and the lane scales come from w4a8_avx512_lanes.h) in the same chunk order,
// and the same ending y = reduce_add(acc + 0) · x_scale. Each token's output therefore has the
// small-T kernel's bits at any T and any row split (tested). Rows with in % 128 != 0 (32-element
// tails) keep the small-T kernel.
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>

#include "base/check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/w4a8_avx512_lanes.h"
#include "kernels/cpu/w4a8_kernels.h"

namespace kestrel::kernels {
namespace {

// Bytes of one unpacked (row, chunk): lo | hi | 16 fp32 lane scales.
constexpr int64_t kTileBytes = 192;
// Rows per unpacked stripe: up to 64, capped so the stripe stays within ~512 KiB of L2 (next to a
// token block's activations). Register tile: kR rows × kU tokens (16 accumulators; the 4 tokens'
// activations and compensation and one row's operands fill the other 16 zmm registers).
constexpr int64_t kMaxStripe = 64, kStripeBytes = 1 << 19;
constexpr int kR = 4, kU = 4;
// Tokens per block: their activations and compensation stay cache-resident while every row group of
// the stripe meets them.
constexpr int64_t kTokBlock = 32;

template <Int8Weights K>
KESTREL_AVX512 void unpack_stripe(const Int8GemmTask& t, int64_t r0, int64_t n, __m512i idx, uint8_t* dst) {
  const int64_t in = t.in, nc = in / 128;
  const int64_t G = K == Int8Weights::kInt4 ? t.group : 32, sbytes = K == Int8Weights::kInt4 ? 2 : 1;
  int64_t r = 0;
  while (r < n) {  // groups of kR rows (then single rows), each group chunk-major: one stream for the tile
    const int64_t g = n - r >= kR ? kR : 1;
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t k = 0; k < g; ++k) {
        const int64_t row = r0 + r + k;
        uint8_t* d = dst + (r * nc + c * g + k) * kTileBytes;
        __m512i lo, hi;
        w4a8_lanes::unpack<K>(_mm512_loadu_si512(t.packed + row * (in / 2) + c * 64), lo, hi);
        _mm512_store_si512(d, lo);
        _mm512_store_si512(d + 64, hi);
        _mm512_store_ps(d + 128, w4a8_lanes::chunk_scales<K>(t.scales + row * (in / G) * sbytes, c, G, idx));
      }
    r += g;
  }
}

// R unpacked rows (group at wt) × U tokens from t0 (x: the token block's first token's activations;
// nc_: its compensation rows, `in/8` int32 per token); writes y[t0 + u, r0 + r].
template <int R, int U>
KESTREL_AVX512 void tile(const uint8_t* wt, const Int8GemmTask& t, const int32_t* ncomp, int64_t t0, int64_t r0) {
  const QuantizedActs& a = *t.acts;
  const int64_t in = t.in, nc = in / 128;
  const int8_t* X = a.qp.data() + t0 * in;
  __m512 acc[R][U];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c, wt += R * kTileBytes) {
    __m512i xe[U], xo[U], n[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      xe[u] = _mm512_loadu_si512(X + u * in + c * 128), xo[u] = _mm512_loadu_si512(X + u * in + c * 128 + 64);
      n[u] = _mm512_loadu_si512(ncomp + u * (in / 8) + c * 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = wt + r * kTileBytes;
      const __m512i lo = _mm512_load_si512(p), hi = _mm512_load_si512(p + 64);
      const __m512 sc = _mm512_load_ps(p + 128);
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(n[u], lo, xe[u]), hi, xo[u]);
        acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[r][u]);
      }
    }
  }
  const __m512 zero = _mm512_setzero_ps();  // the small-T kernel adds its (here empty) tail accumulator
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][u], zero));
      t.y[(t0 + u) * t.ldy + r0 + r] = s * a.scale[static_cast<size_t>(t0 + u)];
    }
}

template <int R>
KESTREL_AVX512 void group_tokens(const uint8_t* wt, const Int8GemmTask& t, const int32_t* ncomp, int64_t t0, int64_t t1,
                                 int64_t r0) {
  const int64_t stride = t.in / 8;
  int64_t u = t0;
  for (; u + kU <= t1; u += kU) tile<R, kU>(wt, t, ncomp + (u - t0) * stride, u, r0);
  for (; u < t1; ++u) tile<R, 1>(wt, t, ncomp + (u - t0) * stride, u, r0);
}

template <Int8Weights K>
KESTREL_AVX512 void run(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  const QuantizedActs& a = *t.acts;
  const int64_t in = t.in, nc = in / 128, T = a.T;
  // Lane i of a chunk covers word i (elements 8i..8i+7), whose group is i·8/G within the chunk.
  const int shift = K == Int8Weights::kInt4 ? __builtin_ctzll(static_cast<unsigned long long>(t.group / 8)) : 2;
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = i >> shift;
  const __m512i idx = _mm512_load_si512(lane_group);
  const int64_t stripe = std::clamp<int64_t>(kStripeBytes / (nc * kTileBytes) / kR * kR, kR, kMaxStripe);
  // 64-byte aligned views of the per-thread buffers: the stripe, then a token block's compensation.
  const size_t wbytes = static_cast<size_t>(stripe * nc * kTileBytes), cbytes = static_cast<size_t>(kTokBlock * in / 8 * 4);
  const uintptr_t raw = reinterpret_cast<uintptr_t>(thread_scratch(kScratchInt8Gemm, (wbytes + cbytes + 64 + 3) / 4));
  uint8_t* buf = reinterpret_cast<uint8_t*>((raw + 63) & ~static_cast<uintptr_t>(63));
  int32_t* ncomp = reinterpret_cast<int32_t*>(buf + wbytes);
  for (int64_t s0 = r0; s0 < r1; s0 += stripe) {
    const int64_t n = std::min(stripe, r1 - s0);
    unpack_stripe<K>(t, s0, n, idx, buf);
    for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
      const int64_t t1 = std::min(T, t0 + kTokBlock);
      for (int64_t u = t0; u < t1; ++u) {  // −c·Σx per word, as the small-T kernel's neg_comp
        const int32_t* ws = a.wsum.data() + u * (in / 8);
        int32_t* dst = ncomp + (u - t0) * (in / 8);
        for (int64_t c = 0; c < nc; ++c)
          _mm512_store_si512(dst + c * 16, w4a8_lanes::neg_comp<K>(_mm512_loadu_si512(ws + c * 16)));
      }
      int64_t r = 0;
      for (; r + kR <= n; r += kR) group_tokens<kR>(buf + r * nc * kTileBytes, t, ncomp, t0, t1, s0 + r);
      for (; r < n; ++r) group_tokens<1>(buf + r * nc * kTileBytes, t, ncomp, t0, t1, s0 + r);
    }
  }
}

}  // namespace

KESTREL_AVX512 void int8_gemm_rows_avx512(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  KCHECK(t.in % 128 == 0, "int8_gemm_rows_avx512: in must be a multiple of 128");
  if (t.kind == Int8Weights::kInt4) run<Int8Weights::kInt4>(t, r0, r1);
  else run<Int8Weights::kMxfp4>(t, r0, r1);
}

}  // namespace kestrel::kernels
