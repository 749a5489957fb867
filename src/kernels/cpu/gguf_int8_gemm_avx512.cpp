// Prefill form of the GGUF Q8_0 / MXFP4 × Q8_0-activation kernel (gguf_int8.h, gguf_int8_gemm_rows;
// Q4_0 runs on its packed rows, gguf_q4_x16.h): convert, then GEMM. A stripe of weight rows is
// unpacked once into a per-thread buffer (u8 codes ready for vpdpbusd and lane-expanded fp32 block
// scales) and then meets every token, whose compensation and lane-expanded scales were laid out once
// at quantization (Q8Acts::n12/dx4, n8/dx8). The per-(row, token, chunk) work is then only the
// arithmetic the small-T kernel (gguf_int8_avx512.cpp) does after its unpack, on the same per-lane
// values:
//   MXFP4: lanes 4k..4k+3 = block k;  p = −12·Σx_k (lane 4k) + dpbusd(lo, x_lo) + dpbusd(hi, x_hi),
//          codes u = 2·E2M1 + 12 (the small-T kernel's vpshufb table), scales 2^(e−128)
//          (gguf_e8m0_half)
//   Q8_0:  two halves, lanes 8j..8j+7 = block 2h+j;  p = −128·Σ(lane's 4 x) + dpbusd(w + 128, x)
//          (the small-T kernel computes the same lane integer as |w| · (x with w's sign))
//   acc[lane] = fma(float(p), d_w · d_x, acc[lane]), chunks in order; y = _mm512_reduce_add_ps(acc).
// Every int32 lane value, every fp32 product and every fma is the small-T kernel's, in the same
// order, so each token's output has the same bits at any T and either path (tested).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_int8_blocks.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/scratch.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma,f16c")))

namespace kestrel::kernels {
namespace {

using gguf_blocks::Kind;
using gguf_blocks::kBlockBytes;
using gguf_blocks::kCodeOffset;

// Bytes of one unpacked (row, 128-element chunk): MXFP4 lo | hi | 16 fp32 scales; Q8_0
// codes+128 of blocks 0,1 | of blocks 2,3 | 16 scales (blocks 0,1) | 16 scales (blocks 2,3).
template <Kind K>
constexpr int64_t kTileBytes = K == Kind::kQ8_0 ? 256 : 192;

// Rows per unpacked stripe: up to 64 (fewer rows re-stream every token's activations more often:
// 2304 × 9216, T = 512, one core: 16 rows 125–131 ms, 64 rows 103–111 ms), capped so the stripe stays
// within ~1 MiB of L2. Register tile: kR rows × kU tokens (4 × 4 measured best against 2 × 8, 3 × 4
// and one row × 8 or 16 tokens).
constexpr int64_t kMaxStripe = 64, kStripeBytes = 1 << 20;
constexpr int kR = 4, kU = 4;

// fp16 block scales of the n (≤ 4) Q8_0 blocks at `blk` (the rest 0) as 4 floats.
KESTREL_AVX512 inline __m128 scales4_q8(const uint8_t* blk, int n) {
  uint16_t h[4] = {0, 0, 0, 0};
  for (int k = 0; k < n; ++k) std::memcpy(&h[k], blk + k * 34, 2);
  return _mm_cvtph_ps(_mm_setr_epi16(static_cast<short>(h[0]), static_cast<short>(h[1]), static_cast<short>(h[2]),
                                     static_cast<short>(h[3]), 0, 0, 0, 0));
}

// The 16 code bytes of each of the n (≤ 4) MXFP4 blocks at `blk` (17 bytes apart, codes at +1), block k
// at bytes 16k..16k+15 (missing blocks 0).
KESTREL_AVX512 inline __m512i codes_mx(const uint8_t* blk, int n) {
  constexpr int64_t B = kBlockBytes<Kind::kMxfp4>, O = kCodeOffset<Kind::kMxfp4>;
  auto ld = [&](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k * B + O)); };
  if (n == 4) {
    const __m256i a = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(0)), ld(1), 1);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(2)), ld(3), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  alignas(64) uint8_t tmp[64] = {};
  for (int k = 0; k < n; ++k) std::memcpy(tmp + 16 * k, blk + k * B + O, 16);
  return _mm512_load_si512(tmp);
}

KESTREL_AVX512 inline __m256i code_q8(const uint8_t* blk, int k, int n) {
  return k < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + k * 34 + 2)) : _mm256_setzero_si256();
}

// One (row, chunk) of MXFP4 → lo, hi codes mapped to 2·E2M1 + 12 (missing blocks: code 0 → 12, as the
// small-T kernel's loader gives them; they meet zero activations and a zero scale), scales 2^(e−128)
// lane-expanded (lanes 4k..4k+3 = block k).
KESTREL_AVX512 void unpack_mx(const uint8_t* blk, int n, uint8_t* dst) {
  const __m512i b = codes_mx(blk, n), nib = _mm512_set1_epi8(15);
  const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  _mm512_store_si512(dst, _mm512_shuffle_epi8(tbl, _mm512_and_si512(b, nib)));
  _mm512_store_si512(dst + 64, _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(b, 4), nib)));
  alignas(16) float s[4] = {0, 0, 0, 0};
  for (int k = 0; k < n; ++k) s[k] = gguf_e8m0_half(blk[k * 17]);
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  _mm512_store_ps(dst + 128, _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_load_ps(s))));
}

// One (row, chunk) of Q8_0 → codes + 128 (u8; missing blocks 0: they meet zero activations), scales
// lane-expanded per half (lanes 8j..8j+7 = block 2h + j).
KESTREL_AVX512 void unpack_q8(const uint8_t* blk, int n, uint8_t* dst) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i w0 = _mm512_inserti64x4(_mm512_castsi256_si512(code_q8(blk, 0, n)), code_q8(blk, 1, n), 1);
  const __m512i w1 = _mm512_inserti64x4(_mm512_castsi256_si512(code_q8(blk, 2, n)), code_q8(blk, 3, n), 1);
  _mm512_store_si512(dst, _mm512_xor_si512(w0, bias));
  _mm512_store_si512(dst + 64, _mm512_xor_si512(w1, bias));
  const __m512 s = _mm512_castps128_ps512(scales4_q8(blk, n));
  _mm512_store_ps(dst + 128, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), s));
  _mm512_store_ps(dst + 192, _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), s));
}

// Rows [r0, r0 + n) into `dst`: groups of R rows (then single rows), each group chunk-major
// (chunk c: its rows' tiles back to back), so the micro-kernel reads one stream.
template <Kind K>
KESTREL_AVX512 void unpack_stripe(const WeightMatrix& w, int64_t nb, int64_t nc, int64_t r0, int64_t n, uint8_t* dst) {
  constexpr int64_t B = kBlockBytes<K>, TB = kTileBytes<K>;
  int64_t r = 0;
  while (r < n) {
    const int64_t g = n - r >= kR ? kR : 1;
    for (int64_t c = 0; c < nc; ++c) {
      const int cn = static_cast<int>(std::min<int64_t>(4, nb - 4 * c));
      for (int64_t k = 0; k < g; ++k) {
        const uint8_t* blk = static_cast<const uint8_t*>(w.data) + (r0 + r + k) * nb * B + 4 * c * B;
        uint8_t* d = dst + (r * nc + c * g + k) * TB;
        if constexpr (K == Kind::kQ8_0) unpack_q8(blk, cn, d);
        else unpack_mx(blk, cn, d);
      }
    }
    r += g;
  }
}

// R unpacked rows (group at `wt`) × U tokens: output tokens t0..t0+U−1, which read activation token
// tok[t0 + u] (t0 + u when tok is null); writes y[t0 + u, r0 + r]. The loops over u and r are unrolled
// so the R·U accumulators stay in registers.
template <Kind K, int R, int U>
KESTREL_AVX512 void tile(const uint8_t* wt, const Q8Acts& a, const int32_t* tok, int64_t t0, float* y, int64_t ldy, int64_t r0) {
  constexpr bool Q8 = K == Kind::kQ8_0;
  constexpr int64_t TB = kTileBytes<K>, NL = Q8 ? 32 : 16;  // lanes of n / dx per chunk
  const int64_t nc = a.nc, P = nc * 128, PL = nc * NL;      // token strides
  const int8_t* X[U];
  const int32_t* N[U];
  const float* D[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const int64_t t = tok ? tok[t0 + u] : t0 + u;
    X[u] = (Q8 ? a.q.data() : a.qg.data()) + t * P;
    N[u] = (Q8 ? a.n8.data() : a.n12.data()) + t * PL;
    D[u] = (Q8 ? a.dx8.data() : a.dx4.data()) + t * PL;
  }
  __m512 acc[R][U];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c, wt += R * TB) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const __m512i x0 = _mm512_loadu_si512(X[u] + c * 128), x1 = _mm512_loadu_si512(X[u] + c * 128 + 64);
      const int32_t* n = N[u] + c * NL;
      const float* d = D[u] + c * NL;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = wt + r * TB;
        if constexpr (Q8) {
          const __m512i p0 = _mm512_dpbusd_epi32(_mm512_loadu_si512(n), _mm512_loadu_si512(p), x0);
          const __m512i p1 = _mm512_dpbusd_epi32(_mm512_loadu_si512(n + 16), _mm512_loadu_si512(p + 64), x1);
          const __m512 s0 = _mm512_mul_ps(_mm512_loadu_ps(p + 128), _mm512_loadu_ps(d));
          const __m512 s1 = _mm512_mul_ps(_mm512_loadu_ps(p + 192), _mm512_loadu_ps(d + 16));
          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), s0, acc[r][u]);
          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), s1, acc[r][u]);
        } else {
          const __m512i lo = _mm512_loadu_si512(p), hi = _mm512_loadu_si512(p + 64);
          const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_loadu_si512(n), lo, x0), hi, x1);
          const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(p + 128), _mm512_loadu_ps(d));
          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[r][u]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][u]);
}

template <Kind K, int R>
KESTREL_AVX512 void group_tokens(const uint8_t* wt, const Q8Acts& a, const int32_t* tok, int64_t t0, int64_t t1, float* y,
                                 int64_t ldy, int64_t r0) {
  int64_t t = t0;
  for (; t + kU <= t1; t += kU) tile<K, R, kU>(wt, a, tok, t, y, ldy, r0);
  for (; t < t1; ++t) tile<K, R, 1>(wt, a, tok, t, y, ldy, r0);
}

// n output tokens (activation tokens tok[i], or i when tok is null).
template <Kind K>
KESTREL_AVX512 void run(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0,
                        int64_t r1) {
  constexpr int64_t TB = kTileBytes<K>;
  const int64_t nb = a.nb, nc = a.nc;
  const int64_t stripe = std::clamp<int64_t>(kStripeBytes / (nc * TB) / kR * kR, kR, kMaxStripe);
  // 64-byte aligned view of the per-thread buffer.
  const size_t bytes = static_cast<size_t>(stripe * nc * TB) + 64;
  const uintptr_t raw = reinterpret_cast<uintptr_t>(thread_scratch(kScratchGgufGemm, (bytes + 3) / 4));
  uint8_t* buf = reinterpret_cast<uint8_t*>((raw + 63) & ~static_cast<uintptr_t>(63));
  for (int64_t s0 = r0; s0 < r1; s0 += stripe) {
    const int64_t n = std::min(stripe, r1 - s0);
    unpack_stripe<K>(w, nb, nc, s0, n, buf);
    // Tokens in blocks of 32, whose activations stay cache-resident while every row group meets them
    // (16 and 64 measured the same).
    constexpr int64_t kTokBlock = 32;
    for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
      const int64_t t1 = std::min(T, t0 + kTokBlock);
      int64_t r = 0;
      for (; r + kR <= n; r += kR) group_tokens<K, kR>(buf + r * nc * TB, a, tok, t0, t1, y, ldy, s0 + r);
      for (; r < n; ++r) group_tokens<K, 1>(buf + r * nc * TB, a, tok, t0, t1, y, ldy, s0 + r);
    }
  }
}

}  // namespace

bool gguf_int8_gemm_format(WeightFormat f) { return f == WeightFormat::kGgufQ8_0 || f == WeightFormat::kGgufMxfp4; }

bool gguf_int8_gemm_prepared(const WeightMatrix& w, const Q8Acts& a) {
  switch (w.format) {
    case WeightFormat::kGgufQ8_0: return a.gemm_q8;
    case WeightFormat::kGgufMxfp4: return a.gemm_mx;
    default: return false;
  }
}

namespace {
KESTREL_AVX512 void gemm_dispatch(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                                  int64_t r0, int64_t r1) {
  KCHECK(gguf_int8_gemm_format(w.format), "gguf_int8_gemm: Q8_0 / MXFP4 only (Q4_0 runs on its packed rows, gguf_q4_x16.h)");
  KCHECK(w.in == a.in, "gguf_int8_gemm: shape mismatch");
  KCHECK(gguf_int8_gemm_prepared(w, a), w.format == WeightFormat::kGgufQ8_0 ? "gguf_int8_gemm: activations prepared without the Q8_0 GEMM layout"
                                                                            : "gguf_int8_gemm: activations prepared without the MXFP4 GEMM layout");
  if (w.format == WeightFormat::kGgufQ8_0) return run<Kind::kQ8_0>(w, a, tok, n, y, ldy, r0, r1);
  run<Kind::kMxfp4>(w, a, tok, n, y, ldy, r0, r1);
}
}  // namespace

void gguf_int8_gemm_rows(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemm_dispatch(w, a, nullptr, a.T, y, ldy, r0, r1);
}

void gguf_int8_gemm_rows_at(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1) {
  for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "gguf_int8_gemm_rows_at: token index out of range");
  gemm_dispatch(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace kestrel::kernels
