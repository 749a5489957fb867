// AVX2 kernel for GGUF Q8_0 and MXFP4 block weights × Q8_0 activations (gguf_int8.h), for CPUs without
// AVX-512 VNNI (Q4_0 runs on its packed rows, gguf_q4_x16.h). It computes what the AVX-512 small-T
// kernel (gguf_int8_avx512.cpp) computes, lane for lane, so a token's outputs have the same bits on
// either CPU:
//   - a 128-element chunk's 16 int32 lanes are two ymm halves: lanes 0-7 (blocks 0, 1) and 8-15
//     (blocks 2, 3);
//   - a lane's integer is the same sum: MXFP4: its 4 low-nibble and 4 high-nibble products as u8 codes
//     (2·E2M1 + 12) × int8 activations, plus the block's −12·Σx in lane 4k; Q8_0: its 4 products
//     through |w| × (x with w's sign). vpmaddubsw forms pairs (no saturation: |pair| ≤ 2·128·127;
//     MXFP4 low + high pairs ≤ 4·24·127 before vpmaddwd), vpmaddwd the lane's 4-product sum;
//   - then per lane acc = fma(float(int32), d_w·d_x, acc) in chunk order, and _mm512_reduce_add_ps's
//     pairing at the end (lanes i + i+8, then i + i+4, i + i+2, i + i+1).
// Register block: R rows × U tokens share each weight unpack and each activation load.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_int8_avx2_blocks.h"
#include "kernels/cpu/gguf_int8_blocks.h"
#include "kernels/cpu/linear_gguf.h"


namespace kestrel::kernels {
namespace {

using gguf_blocks::Kind;
using gguf_blocks::kBlockBytes;
using gguf_blocks::token_ptrs;
using gguf_avx2::block_scales;
using gguf_avx2::code_pair;
using gguf_avx2::spread_hi;
using gguf_avx2::spread_lo;

// _mm512_reduce_add_ps of the lanes (lo = 0-7, hi = 8-15), in GCC's pairing.
KESTREL_AVX2 inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

KESTREL_AVX2 inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Every chunk load is paired with prefetches of the same chunk one and two register blocks ahead
// (gguf_blocks::prefetch_chunk_ahead). Kimi-Linear-shaped Q4_0 tg64 (measured when this kernel also ran
// Q4_0), 2 threads, AMD EPYC Zen 3: no prefetch 46.7 tok/s, 1 KiB ahead 49.9, 4 KiB 68.5, one block
// ahead 70-73; the second, two blocks ahead into L2, was measured on Zen 4 running this kernel
// (docs/PERFORMANCE.md, "Decode prefetch").
inline int64_t prefetch_distance(int R, int64_t row_bytes) { return R * row_bytes; }

// One MXFP4 chunk of R rows × U tokens. Full: all 4 blocks present (every chunk but a ragged last one),
// so the loads need no branches and the whole block stays in registers.
template <int R, int U, bool Full>
KESTREL_AVX2 __attribute__((always_inline)) inline void chunk_mx(const uint8_t* const (&W)[R], const int8_t* const (&X)[U],
                                                               const int32_t* const (&C)[U], const float* const (&D)[U],
                                                               int64_t c, int n, __m256 (&acc)[R][U][2], int64_t pfd) {
  constexpr Kind K = Kind::kMxfp4;
  constexpr int64_t B = kBlockBytes<K>;
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const __m256i tbl = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  __m256i ncomp[U][2];
  __m128 dx[U];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) {
    dx[u] = _mm_loadu_ps(D[u] + 4 * c);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i cs = ld256(C[u] + c * 16 + 8 * h);
      const __m256i cm = _mm256_add_epi32(_mm256_slli_epi32(cs, 3), _mm256_slli_epi32(cs, 2));  // 12·Σx
      ncomp[u][h] = _mm256_sub_epi32(_mm256_setzero_si256(), cm);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const uint8_t* blk = W[r] + 4 * c * B;
    gguf_blocks::prefetch_chunk_ahead<K>(blk, pfd);
    const __m128 dw = block_scales<K>(blk, Full ? 4 : n);
    __m256 sc[U][2];  // d_w·d_x by lanes (the product, then spread: the same values lane by lane)
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const __m128 s4 = _mm_mul_ps(dw, dx[u]);
      sc[u][0] = spread_lo(s4), sc[u][1] = spread_hi(s4);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // lanes 8h .. 8h+7: blocks 2h, 2h+1
      const __m256i codes = code_pair<K>(blk + 2 * h * B, Full ? 2 : std::max(0, n - 2 * h));
      // code → 2·E2M1 + 12 ∈ [0, 24]
      const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(codes, nib));
      const __m256i hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(codes, 4), nib));
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        const __m256i xl = ld256(X[u] + c * 128 + 32 * h), xh = ld256(X[u] + c * 128 + 64 + 32 * h);
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
        const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), ncomp[u][h]);
        acc[r][u][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc[u][h], acc[r][u][h]);
      }
    }
  }
}

// MXFP4: R rows × U tokens over every chunk. Per chunk the tokens' side (their two int8 halves, the
// accumulator start −12·Σx and d_x, by lanes) is read once for all R rows.
template <int R, int U>
KESTREL_AVX2 void block_mx(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, float* y, int64_t ldy, int64_t r0, int64_t t0) {
  constexpr Kind K = Kind::kMxfp4;
  constexpr int64_t B = kBlockBytes<K>;
  const int64_t nb = a.nb, nc = a.nc;
  const uint8_t* W[R];
  for (int r = 0; r < R; ++r) W[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nb * B;
  const int8_t* X[U];
  const int32_t* C[U];
  const float* D[U];
  token_ptrs<K, U>(a, tok, t0, X, C, D);
  __m256 acc[R][U][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) acc[r][u][0] = acc[r][u][1] = _mm256_setzero_ps();
  const int64_t full = nb / 4;
  const int64_t pfd = prefetch_distance(R, nb * B);
  for (int64_t c = 0; c < full; ++c) chunk_mx<R, U, true>(W, X, C, D, c, 4, acc, pfd);
  if (full < nc) chunk_mx<R, U, false>(W, X, C, D, full, static_cast<int>(nb - 4 * full), acc, pfd);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = reduce16(acc[r][u][0], acc[r][u][1]);
}

// Q8_0: blocks 0 and 2 of a chunk go to lanes 0-7, blocks 1 and 3 to lanes 8-15 (the AVX-512 kernel's
// two block pairs), each as fma(float(p), d_w·d_x, acc) in block order.
template <int R, int U, bool Full>
KESTREL_AVX2 __attribute__((always_inline)) inline void chunk_q8(const uint8_t* const (&W)[R], const int8_t* const (&X)[U],
                                                               const float* const (&D)[U], int64_t c, int n,
                                                               __m256 (&acc)[R][U][2], int64_t pfd) {
  constexpr int64_t B = 34;
  const __m256i ones = _mm256_set1_epi16(1);
  __m128 dx[U];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) dx[u] = _mm_loadu_ps(D[u] + 4 * c);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const uint8_t* blk = W[r] + 4 * c * B;
    gguf_blocks::prefetch_chunk_ahead<Kind::kQ8_0>(blk, pfd);
    const __m128 dw = block_scales<Kind::kQ8_0>(blk, Full ? 4 : n);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i wq = Full || k < n ? ld256(blk + k * B + 2) : _mm256_setzero_si256();
      const __m256i aw = _mm256_abs_epi8(wq);
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        const __m256i xs = _mm256_sign_epi8(ld256(X[u] + c * 128 + 32 * k), wq);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones);
        const __m128 sc = _mm_mul_ps(dw, dx[u]);
        const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(sc), _mm256_set1_epi32(k));
        acc[r][u][k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][u][k & 1]);
      }
    }
  }
}

template <int R, int U>
KESTREL_AVX2 void block_q8(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, float* y, int64_t ldy, int64_t r0, int64_t t0) {
  constexpr int64_t B = 34;
  const int64_t nb = a.nb, nc = a.nc;
  const uint8_t* W[R];
  for (int r = 0; r < R; ++r) W[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nb * B;
  const int8_t* X[U];
  const int32_t* C[U];
  const float* D[U];
  token_ptrs<Kind::kQ8_0, U>(a, tok, t0, X, C, D);
  __m256 acc[R][U][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) acc[r][u][0] = acc[r][u][1] = _mm256_setzero_ps();
  const int64_t full = nb / 4, pfd = prefetch_distance(R, nb * B);
  for (int64_t c = 0; c < full; ++c) chunk_q8<R, U, true>(W, X, D, c, 4, acc, pfd);
  if (full < nc) chunk_q8<R, U, false>(W, X, D, full, static_cast<int>(nb - 4 * full), acc, pfd);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = reduce16(acc[r][u][0], acc[r][u][1]);
}

template <Kind K, int R, int U>
KESTREL_AVX2 void block(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, float* y, int64_t ldy, int64_t r0, int64_t t0) {
  if constexpr (K == Kind::kQ8_0) block_q8<R, U>(w, a, tok, y, ldy, r0, t0);
  else block_mx<R, U>(w, a, tok, y, ldy, r0, t0);
}

// One token: 4 rows per pass (decode); several tokens: 2 rows × 3 tokens (ymm registers: 12 accumulators).
template <Kind K>
KESTREL_AVX2 void run(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (T == 1) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) block<K, 4, 1>(w, a, tok, y, ldy, r, 0);
    for (; r < r1; ++r) block<K, 1, 1>(w, a, tok, y, ldy, r, 0);
    return;
  }
  int64_t r = r0;
  auto tokens = [&](auto rows) {
    constexpr int Rn = decltype(rows)::value;
    int64_t t = 0;
    for (; t + 3 <= T; t += 3) block<K, Rn, 3>(w, a, tok, y, ldy, r, t);
    if (T - t == 2) block<K, Rn, 2>(w, a, tok, y, ldy, r, t);
    else if (T - t == 1) block<K, Rn, 1>(w, a, tok, y, ldy, r, t);
  };
  for (; r + 2 <= r1; r += 2) tokens(std::integral_constant<int, 2>{});
  for (; r < r1; ++r) tokens(std::integral_constant<int, 1>{});
}

void dispatch(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  KCHECK(w.format == WeightFormat::kGgufQ8_0 || w.format == WeightFormat::kGgufMxfp4,
         "gguf_int8_rows_avx2: Q8_0 / MXFP4 only (Q4_0 runs on its packed rows, gguf_q4_x16.h)");
  KCHECK(w.in == a.in, "gguf_int8: shape mismatch");
  if (w.format == WeightFormat::kGgufQ8_0) return run<Kind::kQ8_0>(w, a, tok, T, y, ldy, r0, r1);
  run<Kind::kMxfp4>(w, a, tok, T, y, ldy, r0, r1);
}

}  // namespace

void gguf_int8_rows_avx2(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  dispatch(w, a, nullptr, a.T, y, ldy, r0, r1);
}

void gguf_int8_rows_at_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1) {
  for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "gguf_int8_rows_at: token index out of range");
  dispatch(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace kestrel::kernels
