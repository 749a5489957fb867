// Prefill form of the GGUF Q8_0 / MXFP4 × Q8_0-activation kernel for CPUs with AVX2 (FMA, F16C) but no
// AVX-512 VNNI (gguf_int8.h, gguf_int8_gemm_rows_avx2; Q4_0 runs on its packed rows, gguf_q4_x16.h):
// convert, then GEMM, as the AVX-512 form (gguf_int8_gemm_avx512.cpp) does. A stripe of weight rows is
// unpacked once into a per-thread buffer (MXFP4 as u8 codes ready for vpmaddubsw, Q8_0 codes as they
// are, lane-expanded fp32 block scales) and then meets every token, whose compensation and
// lane-expanded scales were laid out once at quantization (Q8Acts::n12/dx4, dx8). Per (row, token,
// chunk) what remains is the arithmetic of the AVX2 small-T kernel (gguf_int8_avx2.cpp) on the same
// per-lane values:
//   MXFP4, half h (lanes 8h..8h+7 = blocks 2h, 2h+1):
//       p = vpmaddwd(vpmaddubsw(lo, x_lo) + vpmaddubsw(hi, x_hi), 1) − 12·Σx in lane 4k
//       (codes as 2·E2M1 + 12, the small-T kernel's table; scales 2^(e−128), gguf_e8m0_half)
//   Q8_0, block k (lanes 8(k & 1) .. +7):  p = vpmaddwd(vpmaddubsw(|w|, x with w's sign), 1)
//   acc[lane] = fma(float(p), d_w · d_x, acc[lane]), chunks (and, for Q8_0, blocks k, k + 2) in order;
//   y = the small-T kernel's reduce16 (the pairing of _mm512_reduce_add_ps).
// A lane's accumulator depends only on its own lanes, so the tile runs the chunk loop once per half
// (lanes 0-7, then 8-15), which halves the accumulators held in registers; each lane still sees its
// fmas in chunk order. Every int32 lane value, fp32 product and fma is the small-T kernel's, in the
// same order, so each token's output has the same bits at any T, row cut and token subset (tested).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_int8_avx2_blocks.h"
#include "kernels/cpu/gguf_int8_blocks.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/scratch.h"


namespace kestrel::kernels {
namespace {

using gguf_blocks::Kind;
using gguf_blocks::kBlockBytes;

// Bytes of one unpacked (row, 128-element chunk). MXFP4: lo codes (64) | hi codes (64) | 16 fp32
// scales (lanes 4k..4k+3 = block k). Q8_0: the int8 codes of blocks 0..3 (128) | 32 fp32 scales
// (8 per block).
template <Kind K>
constexpr int64_t kTileBytes = 256 - 64 * (K != Kind::kQ8_0);

// Register tile: kR rows × kU tokens, one ymm accumulator each per pass over the chunks (2 vCPUs of an
// AMD EPYC Zen 3 under other load, 4096 × 4096 at T = 512, two noisy rounds: 3 × 3 at or near the best
// of 2 × 3, 2 × 4, 4 × 2 and 3 × 3; 1 × 8 behind the small-T kernel). Rows per unpacked stripe: up to
// 63 (21 groups), capped so the stripe stays within 256 KiB (half of a Zen 3 L2, the rest holding the
// tokens it meets; 1 MiB measured no better).
constexpr int kR = 3, kU = 3;
constexpr int64_t kMaxStripe = 21 * kR, kStripeBytes = 1 << 18;

// One (row, chunk) of MXFP4 → lo, hi codes (u8, mapped to 2·E2M1 + 12; missing blocks code 0 as the
// small-T kernel loads them: they meet zero activations and a zero scale), scales: the small-T kernel's
// own loads (gguf_int8_avx2_blocks.h), stored.
KESTREL_AVX2 inline void unpack_mx(const uint8_t* blk, int n, uint8_t* dst) {
  constexpr Kind K = Kind::kMxfp4;
  constexpr int64_t B = kBlockBytes<K>;
  const __m256i nib = _mm256_set1_epi8(15);
  const __m256i tbl = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m256i b = gguf_avx2::code_pair<K>(blk + 2 * h * B, std::max(0, n - 2 * h));
    const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(b, nib));
    const __m256i hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(b, 4), nib));
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * h), lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 64 + 32 * h), hi);
  }
  const __m128 s = gguf_avx2::block_scales<K>(blk, n);
  float* sc = reinterpret_cast<float*>(dst + 128);
  _mm256_store_ps(sc, gguf_avx2::spread_lo(s));
  _mm256_store_ps(sc + 8, gguf_avx2::spread_hi(s));
}

// One (row, chunk) of Q8_0 → codes of blocks 0..3 (missing blocks 0), scales 8 per block.
KESTREL_AVX2 inline void unpack_q8(const uint8_t* blk, int n, uint8_t* dst) {
  const __m128 s = gguf_avx2::block_scales<Kind::kQ8_0>(blk, n);
  float* sc = reinterpret_cast<float*>(dst + 128);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256i q = k < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + k * 34 + 2)) : _mm256_setzero_si256();
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * k), q);
    _mm256_store_ps(sc + 8 * k, _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), _mm256_set1_epi32(k)));
  }
}

// Rows [r0, r0 + n) into `dst`: groups of kR rows (then single rows), each group chunk-major (chunk c:
// its rows' tiles back to back), so the tile reads one stream.
template <Kind K>
KESTREL_AVX2 void unpack_stripe(const WeightMatrix& w, int64_t nb, int64_t nc, int64_t r0, int64_t n, uint8_t* dst) {
  constexpr int64_t B = kBlockBytes<K>, TB = kTileBytes<K>;
  int64_t r = 0;
  while (r < n) {
    const int64_t g = n - r >= kR ? kR : 1;
    for (int64_t c = 0; c < nc; ++c) {
      const int cn = static_cast<int>(std::min<int64_t>(4, nb - 4 * c));
      for (int64_t k = 0; k < g; ++k) {
        const uint8_t* blk = static_cast<const uint8_t*>(w.data) + (r0 + r + k) * nb * B + 4 * c * B;
        gguf_blocks::prefetch_chunk<K>(blk + g * nb * B);  // the same chunk of the next group (gguf_int8_avx2.cpp)
        uint8_t* d = dst + (r * nc + c * g + k) * TB;
        if constexpr (K == Kind::kQ8_0) unpack_q8(blk, cn, d);
        else unpack_mx(blk, cn, d);
      }
    }
    r += g;
  }
}

KESTREL_AVX2 inline __m256i ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// _mm512_reduce_add_ps of the lanes (lo = 0-7, hi = 8-15), in GCC's pairing (as the small-T kernel).
KESTREL_AVX2 inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

// R unpacked rows (group at `wt`) × U tokens, lanes 8h..8h+7 of every chunk into acc. Output tokens
// t0..t0+U−1 read activation token tok[t0 + u] (t0 + u when tok is null).
template <Kind K, int R, int U>
KESTREL_AVX2 inline void half_pass(const uint8_t* wt, int64_t nc, const int8_t* const (&X)[U], const int32_t* const (&N)[U],
                                   const float* const (&D)[U], int h, __m256 (&acc)[R][U]) {
  constexpr int64_t TB = kTileBytes<K>;
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) acc[r][u] = _mm256_setzero_ps();
  for (int64_t c = 0; c < nc; ++c, wt += R * TB) {
    if constexpr (K == Kind::kQ8_0) {
#pragma GCC unroll 2
      for (int k = h; k < 4; k += 2) {  // blocks h, h + 2 in order (the small-T kernel's acc[k & 1])
        __m256i wq[R], aw[R];
        __m256 sw[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          wq[r] = ld(wt + r * TB + 32 * k);
          aw[r] = _mm256_abs_epi8(wq[r]);
          sw[r] = _mm256_loadu_ps(reinterpret_cast<const float*>(wt + r * TB + 128) + 8 * k);
        }
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) {
          const __m256i x = ld(X[u] + c * 128 + 32 * k);
          const __m256 dx = _mm256_loadu_ps(D[u] + c * 32 + 8 * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(x, wq[r])), ones);
            acc[r][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sw[r], dx), acc[r][u]);
          }
        }
      }
    } else {
      __m256i lo[R], hi[R];
      __m256 sw[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        lo[r] = ld(wt + r * TB + 32 * h);
        hi[r] = ld(wt + r * TB + 64 + 32 * h);
        sw[r] = _mm256_loadu_ps(reinterpret_cast<const float*>(wt + r * TB + 128) + 8 * h);
      }
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const __m256i xl = ld(X[u] + c * 128 + 32 * h), xh = ld(X[u] + c * 128 + 64 + 32 * h);
        const __m256i n = ld(N[u] + c * 16 + 8 * h);
        const __m256 dx = _mm256_loadu_ps(D[u] + c * 16 + 8 * h);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], xl), _mm256_maddubs_epi16(hi[r], xh));
          const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), n);
          acc[r][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sw[r], dx), acc[r][u]);
        }
      }
    }
  }
}

template <Kind K, int R, int U>
KESTREL_AVX2 void tile(const uint8_t* wt, const Q8Acts& a, const int32_t* tok, int64_t t0, float* y, int64_t ldy, int64_t r0) {
  constexpr bool Q8 = K == Kind::kQ8_0;
  constexpr int64_t NL = Q8 ? 32 : 16;  // lanes of n / dx per chunk
  const int64_t nc = a.nc, P = nc * 128, PL = nc * NL;
  const int8_t* X[U];
  const int32_t* N[U];
  const float* D[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const int64_t t = tok ? tok[t0 + u] : t0 + u;
    X[u] = (Q8 ? a.q.data() : a.qg.data()) + t * P;
    N[u] = Q8 ? nullptr : a.n12.data() + t * PL;
    D[u] = (Q8 ? a.dx8.data() : a.dx4.data()) + t * PL;
  }
  __m256 lo[R][U], hi[R][U];
  half_pass<K, R, U>(wt, nc, X, N, D, 0, lo);
  half_pass<K, R, U>(wt, nc, X, N, D, 1, hi);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = reduce16(lo[r][u], hi[r][u]);
}

template <Kind K, int R>
KESTREL_AVX2 void group_tokens(const uint8_t* wt, const Q8Acts& a, const int32_t* tok, int64_t t0, int64_t t1, float* y,
                               int64_t ldy, int64_t r0) {
  int64_t t = t0;
  for (; t + kU <= t1; t += kU) tile<K, R, kU>(wt, a, tok, t, y, ldy, r0);
  if (t1 - t == 2) return tile<K, R, 2>(wt, a, tok, t, y, ldy, r0);  // two tokens share each weight load
  for (; t < t1; ++t) tile<K, R, 1>(wt, a, tok, t, y, ldy, r0);
}

// n output tokens (activation tokens tok[i], or i when tok is null).
template <Kind K>
KESTREL_AVX2 void run(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0,
                      int64_t r1) {
  constexpr int64_t TB = kTileBytes<K>;
  const int64_t nb = a.nb, nc = a.nc;
  const int64_t stripe = std::clamp<int64_t>(kStripeBytes / (nc * TB) / kR * kR, kR, kMaxStripe);
  const size_t bytes = static_cast<size_t>(stripe * nc * TB) + 64;
  const uintptr_t raw = reinterpret_cast<uintptr_t>(thread_scratch(kScratchGgufGemm, (bytes + 3) / 4));
  uint8_t* buf = reinterpret_cast<uint8_t*>((raw + 63) & ~static_cast<uintptr_t>(63));
  for (int64_t s0 = r0; s0 < r1; s0 += stripe) {
    const int64_t n = std::min(stripe, r1 - s0);
    unpack_stripe<K>(w, nb, nc, s0, n, buf);
    // Tokens in blocks whose activations stay cache-resident while every row group meets them.
    constexpr int64_t kTokBlock = 32;
    for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
      const int64_t t1 = std::min(T, t0 + kTokBlock);
      int64_t r = 0;
      for (; r + kR <= n; r += kR) group_tokens<K, kR>(buf + r * nc * TB, a, tok, t0, t1, y, ldy, s0 + r);
      for (; r < n; ++r) group_tokens<K, 1>(buf + r * nc * TB, a, tok, t0, t1, y, ldy, s0 + r);
    }
  }
}

void gemm_dispatch(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy, int64_t r0,
                   int64_t r1) {
  KCHECK(gguf_int8_gemm_format(w.format), "gguf_int8_gemm: Q8_0 / MXFP4 only (Q4_0 runs on its packed rows, gguf_q4_x16.h)");
  KCHECK(w.in == a.in, "gguf_int8_gemm: shape mismatch");
  KCHECK(gguf_int8_gemm_prepared(w, a), w.format == WeightFormat::kGgufQ8_0 ? "gguf_int8_gemm: activations prepared without the Q8_0 GEMM layout"
                                                                            : "gguf_int8_gemm: activations prepared without the MXFP4 GEMM layout");
  if (w.format == WeightFormat::kGgufQ8_0) return run<Kind::kQ8_0>(w, a, tok, n, y, ldy, r0, r1);
  run<Kind::kMxfp4>(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace

void gguf_int8_gemm_rows_avx2(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemm_dispatch(w, a, nullptr, a.T, y, ldy, r0, r1);
}

void gguf_int8_gemm_rows_at_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                                 int64_t r0, int64_t r1) {
  for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "gguf_int8_gemm_rows_at: token index out of range");
  gemm_dispatch(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace kestrel::kernels
