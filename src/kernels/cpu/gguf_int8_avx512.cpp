// AVX-512 VNNI kernel for GGUF Q8_0 and MXFP4 block weights × Q8_0 activations (gguf_int8.h; Q4_0 runs
// on its packed rows, gguf_q4_x16.h).
// Work unit: one 128-element chunk = 4 ggml blocks of a row.
//   MXFP4: the 4 blocks' 16 code bytes are gathered into one zmm (128-bit inserts; blocks are 17 bytes
//   apart). Low nibbles are elements 0..15 of each block, high nibbles 16..31, matching the
//   activations' `qg` order, so dpbusd(lo, x_lo) + dpbusd(hi, x_hi) puts block k's sum into lanes
//   4k..4k+3. Codes are used as unsigned bytes u = 2·E2M1 + 12 (via pshufb) and the accumulator starts
//   at −12·Σx of the block (`comp`), so the int32 sums are exact.
//   Q8_0: two zmm of 2 blocks each; signed × signed through |w| (u8) × (x with w's sign).
// Then per lane: acc += float(int32) · (d_w · d_x) of its block; y = Σ lanes. Register block:
// R rows × U tokens share each weight unpack and each activation load.
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "base/check.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_int8_blocks.h"
#include "kernels/cpu/linear_gguf.h"

#define KESTREL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma,f16c")))

namespace kestrel::kernels {
namespace {

using gguf_blocks::Kind;
using gguf_blocks::kBlockBytes;
using gguf_blocks::kCodeOffset;
using gguf_blocks::token_ptrs;

// fp32 scales of the n (≤ 4) blocks starting at `blk` (the rest 0), as 4 floats.
template <Kind K>
KESTREL_AVX512 inline __m128 block_scales(const uint8_t* blk, int n) {
  if constexpr (K == Kind::kMxfp4) {
    alignas(16) float s[4] = {0, 0, 0, 0};
    for (int k = 0; k < n; ++k) s[k] = gguf_e8m0_half(blk[k * 17]);
    return _mm_load_ps(s);
  } else {
    alignas(16) uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < n; ++k) std::memcpy(&h[k], blk + k * kBlockBytes<K>, 2);
    return _mm_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
  }
}

// 16 code bytes of each of the n (≤ 4) blocks starting at `blk` → one zmm (missing blocks 0).
template <Kind K>
KESTREL_AVX512 inline __m512i gather_codes(const uint8_t* blk, int n) {
  constexpr int64_t B = kBlockBytes<K>, O = kCodeOffset<K>;
  auto ld = [&](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k * B + O)); };
  if (n == 4) {
    const __m256i a = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(0)), ld(1), 1);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(2)), ld(3), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  alignas(64) uint8_t tmp[64] = {};
  for (int k = 0; k < n && k < 3; ++k) std::memcpy(tmp + 16 * k, blk + k * B + O, 16);  // n < 4 here
  return _mm512_load_si512(tmp);
}

// Q8_0: the 32 int8 codes of blocks k, k+1 (each present or not) → one zmm.
KESTREL_AVX512 inline __m512i q8_pair(const uint8_t* blk, int n_present) {
  if (n_present == 2) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 34 + 2));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  if (n_present == 1) return _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  return _mm512_setzero_si512();
}

// Shared per-chunk arithmetic of the generic and the VBMI kernels (they differ only in how a chunk's
// codes and scales are loaded), so both give the same bits.
// Lane → block of its chunk (MXFP4: lanes 4k..4k+3; Q8_0 half h: lanes 8j..8j+7 → block 2h + j).
KESTREL_AVX512 inline __m512i lanes_idx4() { return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); }

// MXFP4 activation side of chunk c for U tokens: the two int8 halves (qg order), the accumulator
// start −12·Σx per block, and d_x expanded to its block's lanes.
template <int U>
KESTREL_AVX512 inline void chunk_acts(const int8_t* const (&X)[U], const int32_t* const (&C)[U], const float* const (&D)[U],
                                      int64_t c, __m512i (&xl)[U], __m512i (&xh)[U], __m512i (&nc_)[U], __m512 (&dx)[U]) {
  for (int u = 0; u < U; ++u) {
    xl[u] = _mm512_loadu_si512(X[u] + c * 128);
    xh[u] = _mm512_loadu_si512(X[u] + c * 128 + 64);
    const __m512i cs = _mm512_loadu_si512(C[u] + c * 16);
    const __m512i cm = _mm512_add_epi32(_mm512_slli_epi32(cs, 3), _mm512_slli_epi32(cs, 2));  // 12·Σx
    nc_[u] = _mm512_sub_epi32(_mm512_setzero_si512(), cm);
    dx[u] = _mm512_permutexvar_ps(lanes_idx4(), _mm512_castps128_ps512(_mm_loadu_ps(D[u] + 4 * c)));
  }
}

// One MXFP4 row's chunk (64 code bytes, lane-expanded d_w) against U tokens: acc[u] += Σ_block int · d_w·d_x.
template <int U>
KESTREL_AVX512 inline void chunk_dot(__m512i bytes, __m512 dw, const __m512i (&xl)[U], const __m512i (&xh)[U],
                                     const __m512i (&nc_)[U], const __m512 (&dx)[U], __m512* acc) {
  const __m512i nib = _mm512_set1_epi8(15);
  // code → 2·E2M1 + 12 ∈ [0, 24]
  const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(bytes, nib));
  const __m512i hi = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nib));
  for (int u = 0; u < U; ++u) {
    const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(nc_[u], lo, xl[u]), hi, xh[u]);
    acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx[u]), acc[u]);
  }
}

// Q8_0: one row's two block pairs (w0: blocks 0, 1; w1: blocks 2, 3) and its 4 scales (lanes 0..3)
// against U tokens; signed × signed through |w| (u8) × (x with w's sign).
template <int U>
KESTREL_AVX512 inline void q8_chunk_dot(__m512i w0, __m512i w1, __m512 dw, const int8_t* const (&X)[U], int64_t c,
                                        const __m512 (&dx)[U], __m512* acc) {
  const __m512i idx8lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i idx8hi = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __mmask64 s0 = _mm512_movepi8_mask(w0), s1 = _mm512_movepi8_mask(w1);
  const __m512i a0 = _mm512_abs_epi8(w0), a1 = _mm512_abs_epi8(w1);
  for (int u = 0; u < U; ++u) {
    const __m512i x0 = _mm512_loadu_si512(X[u] + c * 128), x1 = _mm512_loadu_si512(X[u] + c * 128 + 64);
    const __m512i z = _mm512_setzero_si512();
    const __m512i p0 = _mm512_dpbusd_epi32(z, a0, _mm512_mask_sub_epi8(x0, s0, z, x0));
    const __m512i p1 = _mm512_dpbusd_epi32(z, a1, _mm512_mask_sub_epi8(x1, s1, z, x1));
    const __m512 sc = _mm512_mul_ps(dw, dx[u]);  // lanes 0..3: block scale products
    acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(idx8lo, sc), acc[u]);
    acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(idx8hi, sc), acc[u]);
  }
}

template <Kind K, int R, int U>
KESTREL_AVX512 void block(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, float* y, int64_t ldy, int64_t r0, int64_t t0) {
  constexpr int64_t B = kBlockBytes<K>;
  const int64_t nb = a.nb, nc = a.nc;
  const uint8_t* W[R];
  for (int r = 0; r < R; ++r) W[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nb * B;
  const int8_t* X[U];
  const int32_t* C[U];
  const float* D[U];
  token_ptrs<K, U>(a, tok, t0, X, C, D);
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    const int n = static_cast<int>(std::min<int64_t>(4, nb - 4 * c));
    if constexpr (K == Kind::kQ8_0) {
      __m512 dx[U];
      for (int u = 0; u < U; ++u) dx[u] = _mm512_castps128_ps512(_mm_loadu_ps(D[u] + 4 * c));
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = W[r] + 4 * c * B;
        q8_chunk_dot<U>(q8_pair(blk, std::min(n, 2)), q8_pair(blk + 2 * B, std::max(0, n - 2)),
                        _mm512_castps128_ps512(block_scales<K>(blk, n)), X, c, dx, acc[r]);
      }
    } else {
      __m512i xl[U], xh[U], nc_[U];
      __m512 dx[U];
      chunk_acts<U>(X, C, D, c, xl, xh, nc_, dx);
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = W[r] + 4 * c * B;
        const __m512 dw = _mm512_permutexvar_ps(lanes_idx4(), _mm512_castps128_ps512(block_scales<K>(blk, n)));
        chunk_dot<U>(gather_codes<K>(blk, n), dw, xl, xh, nc_, dx, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][u]);
}

template <Kind K, int R>
KESTREL_AVX512 void rows(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0) {
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) block<K, R, 4>(w, a, tok, y, ldy, r0, t);
  for (; t < T; ++t) block<K, R, 1>(w, a, tok, y, ldy, r0, t);
}

template <Kind K>
KESTREL_AVX512 void run(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows<K, 4>(w, a, tok, T, y, ldy, r);
  for (; r < r1; ++r) rows<K, 1>(w, a, tok, T, y, ldy, r);
}

// ---- VBMI path: whole 128-element chunks (in % 128 == 0, every real model width) ----------------
// An MXFP4 chunk's 4 blocks are contiguous (68 bytes): one 64-byte load plus the 4 bytes after it,
// then one vpermt2b gathers the 64 code bytes and one vpermb lays the 4 block scales out lane by lane
// (the E8M0 byte in each dword). No stack round trip, no per-block inserts: the decode GEMV stays
// memory-bound.
#define KESTREL_AVX512_VBMI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi,fma,f16c")))

struct MxIdx {
  alignas(64) uint8_t codes[64];   // byte 16k + j ← chunk byte 17k + 1 + j
  alignas(64) uint8_t scales[64];  // byte 4l ← 17·(l/4) (the E8M0 byte of lane l's block)
  constexpr MxIdx() : codes(), scales() {
    constexpr Kind K = Kind::kMxfp4;
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 16; ++j) codes[16 * k + j] = static_cast<uint8_t>(kBlockBytes<K> * k + kCodeOffset<K> + j);
    for (int l = 0; l < 16; ++l) scales[4 * l] = static_cast<uint8_t>(kBlockBytes<K> * (l / 4));
  }
};
inline constexpr MxIdx kMxIdx{};

// Codes (as 64 bytes) and per-lane fp32 block scales of the MXFP4 chunk at p.
KESTREL_AVX512_VBMI inline void load_chunk_mx(const uint8_t* p, __m512i ci, __m512i si, __m512i& codes, __m512& dw) {
  const __m512i a = _mm512_loadu_si512(p);
  int32_t t;
  std::memcpy(&t, p + 64, 4);
  codes = _mm512_permutex2var_epi8(a, ci, _mm512_zextsi128_si512(_mm_cvtsi32_si128(t)));
  // 2^(e−128) exactly as gguf_e8m0_half: e < 2 → subnormals 0x00200000 << e
  const __m512i e = _mm512_maskz_permutexvar_epi8(0x1111111111111111ULL, si, a);
  const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
  dw = _mm512_castsi512_ps(_mm512_mask_mov_epi32(big, _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), small));
}

// MXFP4. pf: prefetch the next register blocks' rows (the first token block of these rows; later ones
// find them in cache).
template <int R, int U>
KESTREL_AVX512_VBMI void block_vbmi_mx(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, float* y, int64_t ldy, int64_t r0,
                                       int64_t t0, bool pf) {
  constexpr Kind K = Kind::kMxfp4;
  constexpr int64_t CB = 4 * kBlockBytes<K>;
  const int64_t nc = a.nc;
  const uint8_t* W[R];
  for (int r = 0; r < R; ++r) W[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nc * CB;
  const int8_t* X[U];
  const int32_t* C[U];
  const float* D[U];
  token_ptrs<K, U>(a, tok, t0, X, C, D);
  const __m512i ci = _mm512_load_si512(kMxIdx.codes), si = _mm512_load_si512(kMxIdx.scales);
  const int64_t block_bytes = R * nc * CB;
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  // With the GEMM layout prepared (the same lane values, laid out once per token), the token side of a
  // chunk is four loads: no shifts, subtraction or permute per block call.
  const bool laid_out = a.gemm_mx;
  const int32_t* N[U];
  const float* DX[U];
  if (laid_out)
    for (int u = 0; u < U; ++u) {
      const int64_t t = tok ? tok[t0 + u] : t0 + u;
      N[u] = a.n12.data() + t * nc * 16, DX[u] = a.dx4.data() + t * nc * 16;
    }
  for (int64_t c = 0; c < nc; ++c) {
    __m512i xl[U], xh[U], nc_[U];
    __m512 dx[U];
    if (laid_out) {
      for (int u = 0; u < U; ++u) {
        xl[u] = _mm512_loadu_si512(X[u] + c * 128), xh[u] = _mm512_loadu_si512(X[u] + c * 128 + 64);
        nc_[u] = _mm512_loadu_si512(N[u] + c * 16), dx[u] = _mm512_loadu_ps(DX[u] + c * 16);
      }
    } else {
      chunk_acts<U>(X, C, D, c, xl, xh, nc_, dx);
    }
    for (int r = 0; r < R; ++r) {
      __m512i bytes;
      __m512 dw;
      if (pf) gguf_blocks::prefetch_chunk_ahead<K>(W[r] + c * CB, block_bytes);
      load_chunk_mx(W[r] + c * CB, ci, si, bytes, dw);
      chunk_dot<U>(bytes, dw, xl, xh, nc_, dx, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][u]);
}

// Q8_0 chunks (4 blocks = 136 bytes): two vpermt2b gather the 128 code bytes into the two block
// pairs the generic kernel builds with inserts, one more the 4 fp16 scales; the arithmetic after the
// loads is the generic kernel's, so the bits are the same.
struct Q8Idx {
  alignas(64) uint8_t w0[64], w1[64], sc[64];
  constexpr Q8Idx() : w0(), w1(), sc() {
    for (int j = 0; j < 64; ++j) {
      const int blk = j / 32, e = j % 32;
      w0[j] = static_cast<uint8_t>(34 * blk + 2 + e);            // from (A = bytes 0..63, B = 64..127)
      w1[j] = static_cast<uint8_t>(34 * (blk + 2) + 2 + e - 64);  // from (B, C = bytes 128..135)
    }
    for (int k = 0; k < 4; ++k) sc[2 * k] = static_cast<uint8_t>(34 * k), sc[2 * k + 1] = static_cast<uint8_t>(34 * k + 1);
  }
};
inline constexpr Q8Idx kQ8Idx{};

template <int R, int U>
KESTREL_AVX512_VBMI void block_vbmi_q8(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, float* y, int64_t ldy, int64_t r0,
                                       int64_t t0, bool pf) {
  constexpr int64_t CB = 4 * 34;
  const int64_t nc = a.nc;
  const uint8_t* W[R];
  for (int r = 0; r < R; ++r) W[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nc * CB;
  const int8_t* X[U];
  const int32_t* C[U];
  const float* D[U];
  token_ptrs<Kind::kQ8_0, U>(a, tok, t0, X, C, D);
  const __m512i i0 = _mm512_load_si512(kQ8Idx.w0), i1 = _mm512_load_si512(kQ8Idx.w1), is = _mm512_load_si512(kQ8Idx.sc);
  const int64_t block_bytes = R * nc * CB;
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    __m512 dx[U];
    for (int u = 0; u < U; ++u) dx[u] = _mm512_castps128_ps512(_mm_loadu_ps(D[u] + 4 * c));
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = W[r] + c * CB;
      if (pf) gguf_blocks::prefetch_chunk_ahead<Kind::kQ8_0>(p, block_bytes);
      const __m512i A = _mm512_loadu_si512(p), B = _mm512_loadu_si512(p + 64);
      const __m512i Ct = _mm512_zextsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 128)));
      const __m512 dw = _mm512_castps128_ps512(_mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(A, is, B))));
      q8_chunk_dot<U>(_mm512_permutex2var_epi8(A, i0, B), _mm512_permutex2var_epi8(B, i1, Ct), dw, X, c, dx, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) y[(t0 + u) * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][u]);
}

template <Kind K, int R>
KESTREL_AVX512_VBMI void rows_vbmi(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0) {
  int64_t t = 0;
  if constexpr (K == Kind::kQ8_0) {
    for (; t + 4 <= T; t += 4) block_vbmi_q8<R, 4>(w, a, tok, y, ldy, r0, t, t == 0);
    if (T - t == 3) block_vbmi_q8<R, 3>(w, a, tok, y, ldy, r0, t, t == 0);
    else if (T - t == 2) block_vbmi_q8<R, 2>(w, a, tok, y, ldy, r0, t, t == 0);
    else if (T - t == 1) block_vbmi_q8<R, 1>(w, a, tok, y, ldy, r0, t, t == 0);
  } else {
    for (; t + 4 <= T; t += 4) block_vbmi_mx<R, 4>(w, a, tok, y, ldy, r0, t, t == 0);
    if (T - t == 3) block_vbmi_mx<R, 3>(w, a, tok, y, ldy, r0, t, t == 0);
    else if (T - t == 2) block_vbmi_mx<R, 2>(w, a, tok, y, ldy, r0, t, t == 0);
    else if (T - t == 1) block_vbmi_mx<R, 1>(w, a, tok, y, ldy, r0, t, t == 0);
  }
}

template <Kind K>
KESTREL_AVX512_VBMI void run_vbmi(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy, int64_t r0,
                                 int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows_vbmi<K, 4>(w, a, tok, T, y, ldy, r);
  for (; r < r1; ++r) rows_vbmi<K, 1>(w, a, tok, T, y, ldy, r);
}

bool cpu_has_vbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has;
}

}  // namespace

bool gguf_int8_vbmi_applies(const WeightMatrix& w) {
  return cpu_has_vbmi() && w.in % 128 == 0 && (w.format == WeightFormat::kGgufMxfp4 || w.format == WeightFormat::kGgufQ8_0);
}

namespace {
KESTREL_AVX512 void rows_dispatch(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t T, float* y, int64_t ldy,
                                  int64_t r0, int64_t r1, bool vbmi) {
  KCHECK(w.format == WeightFormat::kGgufQ8_0 || w.format == WeightFormat::kGgufMxfp4,
         "gguf_int8_rows_avx512: Q8_0 / MXFP4 only (Q4_0 runs on its packed rows, gguf_q4_x16.h)");
  KCHECK(w.in == a.in, "gguf_int8: shape mismatch");
  const bool q8 = w.format == WeightFormat::kGgufQ8_0;
  if (vbmi && gguf_int8_vbmi_applies(w))
    return q8 ? run_vbmi<Kind::kQ8_0>(w, a, tok, T, y, ldy, r0, r1) : run_vbmi<Kind::kMxfp4>(w, a, tok, T, y, ldy, r0, r1);
  return q8 ? run<Kind::kQ8_0>(w, a, tok, T, y, ldy, r0, r1) : run<Kind::kMxfp4>(w, a, tok, T, y, ldy, r0, r1);
}
}  // namespace

void gguf_int8_rows_avx512(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1, bool vbmi) {
  rows_dispatch(w, a, nullptr, a.T, y, ldy, r0, r1, vbmi);
}

void gguf_int8_rows_at(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy, int64_t r0,
                       int64_t r1, bool vbmi) {
  for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, "gguf_int8_rows_at: token index out of range");
  rows_dispatch(w, a, tok, n, y, ldy, r0, r1, vbmi);
}

}  // namespace kestrel::kernels
