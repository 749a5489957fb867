#include "kernels/cpu/linear.h"

#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/avx2_lanes.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/w4a8_format.h"
#include "kernels/cpu/w4a8_gemm.h"

namespace kestrel::kernels {
namespace {

typedef int8_t v16i8 __attribute__((vector_size(16)));
typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i32 __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
// Unaligned 16-float load as one vector op. (std::memcpy into a v16f is split by GCC 12 into two
// 32-byte moves through the stack, and keeps the kernels' accumulators in memory.)
typedef float v16f_alias __attribute__((vector_size(64), aligned(4), may_alias));
inline v16f load16(const float* p) { return *reinterpret_cast<const v16f_alias*>(p); }
inline void store16(float* p, v16f v) { *reinterpret_cast<v16f_alias*>(p) = v; }

#if defined(__AVX2__) && !defined(__AVX512F__)
typedef float v8f __attribute__((vector_size(32)));
// Two 8-float registers as one v16f (lanes 0-7 from lo), without a trip through memory.
inline v16f join8(__m256 lo, __m256 hi) {
  return __builtin_shufflevector(static_cast<v8f>(lo), static_cast<v8f>(hi), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
#endif

// 16 bf16 → 16 fp32 in registers: zero-extend and shift into the high half (exact). AVX-512: one
// vpmovzxwd from memory (GCC 12 splits the generic conversion into two halves and an insert).
inline v16f load_bf16x16(const uint16_t* p) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return (v16f)((v16u32)w << 16);
#elif defined(__AVX2__)
  // Two vpmovzxwd from memory and shifts, joined as the register pair a v16f is here. (The generic form went
  // through the stack twice: bf16 decode GEMVs ran at a third of the memory bandwidth.)
  const __m256i a = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  const __m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))), 16);
  return join8(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
#else
  v16u16 h;
  std::memcpy(&h, p, 32);
  const v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  v16f f;
  std::memcpy(&f, &w, 64);
  return f;
#endif
}

// 16 f16 → 16 fp32 (exact).
inline v16f load_f16x16(const uint16_t* p) {
  v16f f;
#if defined(__AVX512F__)
  // (Masked form: GCC 12 warns on the plain intrinsic's undefined pass-through operand.)
  const __m512 v = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  std::memcpy(&f, &v, 64);
#elif defined(__AVX2__) && defined(__F16C__)
  f = join8(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))));
#else
  for (int k = 0; k < 16; ++k) f[k] = f16_to_f32(p[k]);
#endif
  return f;
}

// One MXFP4 32-block: 16 bytes (element 2j in the low nibble of byte j, 2j+1 in the high nibble)
// and one E8M0 scale. Vectorised: a 16-entry byte table lookup (pshufb) maps codes to 2·E2M1 as
// small integers, an unpack restores element order, then int8 → float × scale/2.
// (Code 8, "-0", decodes to +0; equal as a value.)
inline void decode_mxfp4_block(const uint8_t* packed16, uint8_t scale, v16f& f1, v16f& f2) {
  v16i8 first, second;
#if defined(__SSSE3__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed16));
  const __m128i nib = _mm_set1_epi8(15);
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i vlo = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nib));
  const __m128i vhi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), nib));
  const __m128i a = _mm_unpacklo_epi8(vlo, vhi), b = _mm_unpackhi_epi8(vlo, vhi);
  std::memcpy(&first, &a, 16);
  std::memcpy(&second, &b, 16);
#else
  static constexpr int8_t kTable[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int j = 0; j < 8; ++j) {
    first[2 * j] = kTable[packed16[j] & 15], first[2 * j + 1] = kTable[packed16[j] >> 4];
    second[2 * j] = kTable[packed16[8 + j] & 15], second[2 * j + 1] = kTable[packed16[8 + j] >> 4];
  }
#endif
  const float half_scale = 0.5f * e8m0_to_f32(scale);
  // Two-step widening (int8 → int32 → float): GCC 12 scalarises a direct int8 → float conversion.
  f1 = __builtin_convertvector(__builtin_convertvector(first, v16i32), v16f) * half_scale;
  f2 = __builtin_convertvector(__builtin_convertvector(second, v16i32), v16f) * half_scale;
}

// Lane sums of n ≤ 16 accumulators in the kernels' fixed order: out[j] = ((0 + a[j][0]) + a[j][1]) + …
// + a[j][15], the scalar loop `s = 0; for k: s += a[j][k]` bit for bit (the +0 start included).
// AVX-512: the accumulators are transposed (vector k's lane j = a[j][k]) and the vectors added in
// order k = 0..15, so every output lane runs exactly that scalar chain: for 16 outputs 64 shuffles
// and 16 vector adds instead of 256 lane extracts and dependent scalar adds. Other builds: the loop.
#if defined(__AVX512F__)
// (Masked forms: GCC 12 warns on the plain intrinsics' undefined pass-through operand.)
// 4×4 transposes inside each 128-bit chunk c: on return r[m] chunk c = (r0[4c+m], r1[4c+m], r2[4c+m], r3[4c+m]).
inline __attribute__((always_inline)) void transpose_in_chunks(__m512* r) {
  const __m512d t0 = _mm512_castps_pd(_mm512_maskz_unpacklo_ps(0xFFFF, r[0], r[1]));
  const __m512d t1 = _mm512_castps_pd(_mm512_maskz_unpackhi_ps(0xFFFF, r[0], r[1]));
  const __m512d t2 = _mm512_castps_pd(_mm512_maskz_unpacklo_ps(0xFFFF, r[2], r[3]));
  const __m512d t3 = _mm512_castps_pd(_mm512_maskz_unpackhi_ps(0xFFFF, r[2], r[3]));
  r[0] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, t0, t2));
  r[1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, t0, t2));
  r[2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, t1, t3));
  r[3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, t1, t3));
}

#endif

// 5..16 outputs: full 16×16 transpose (missing accumulators are zero vectors).
inline __attribute__((always_inline)) void lane_sums16(const v16f* a, int n, float* out) {
#if defined(__AVX512F__)
  __m512 r[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    if (j < n) r[j] = (__m512)a[j];
    else r[j] = _mm512_setzero_ps();
  }
  for (int g = 0; g < 4; ++g) transpose_in_chunks(r + 4 * g);  // r[4g + m] chunk c: rows 4g..4g+3, lane 4c + m
  __m512 v[16];  // v[4c + m] chunk g = r[4g + m] chunk c, i.e. v[k] lane j = a[j][k]
  for (int m = 0; m < 4; ++m) {
    const __m512 A = _mm512_maskz_shuffle_f32x4(0xFFFF, r[m], r[4 + m], 0x44);  // r[m].c0 c1, r[4+m].c0 c1
    const __m512 B = _mm512_maskz_shuffle_f32x4(0xFFFF, r[m], r[4 + m], 0xEE);  // … c2 c3
    const __m512 C = _mm512_maskz_shuffle_f32x4(0xFFFF, r[8 + m], r[12 + m], 0x44);
    const __m512 D = _mm512_maskz_shuffle_f32x4(0xFFFF, r[8 + m], r[12 + m], 0xEE);
    v[m] = _mm512_maskz_shuffle_f32x4(0xFFFF, A, C, 0x88);  // chunk 0 of each
    v[4 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, A, C, 0xDD);
    v[8 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, B, D, 0x88);
    v[12 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, B, D, 0xDD);
  }
  __m512 s = _mm512_setzero_ps();
  for (int k = 0; k < 16; ++k) s = _mm512_add_ps(s, v[k]);
  float tmp[16];
  _mm512_storeu_ps(tmp, s);
  for (int j = 0; j < n; ++j) out[j] = tmp[j];
#else
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int k = 0; k < 16; ++k) s += a[j][k];
    out[j] = s;
  }
#endif
}

// 1..4 outputs: the in-chunk transpose, then 16 adds of 4-float vectors in lane order (chunk c, m).
inline __attribute__((always_inline)) void lane_sums4(const v16f* a, int n, float* out) {
#if defined(__AVX512F__)
  __m512 r[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    if (j < n) r[j] = (__m512)a[j];
    else r[j] = _mm512_setzero_ps();
  }
  transpose_in_chunks(r);  // r[m] chunk c: outputs 0..3, lane 4c + m
  __m128 s = _mm_setzero_ps();
  for (int m = 0; m < 4; ++m) s = _mm_add_ps(s, _mm512_maskz_extractf32x4_ps(0xF, r[m], 0));
  for (int m = 0; m < 4; ++m) s = _mm_add_ps(s, _mm512_maskz_extractf32x4_ps(0xF, r[m], 1));
  for (int m = 0; m < 4; ++m) s = _mm_add_ps(s, _mm512_maskz_extractf32x4_ps(0xF, r[m], 2));
  for (int m = 0; m < 4; ++m) s = _mm_add_ps(s, _mm512_maskz_extractf32x4_ps(0xF, r[m], 3));
  float tmp[4];
  _mm_storeu_ps(tmp, s);
  for (int j = 0; j < n; ++j) out[j] = tmp[j];
#else
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int k = 0; k < 16; ++k) s += a[j][k];
    out[j] = s;
  }
#endif
}

// The R×U accumulators' lane sums, token-major: sums[u * R + r] for acc[r][u].
template <int R, int U>
inline __attribute__((always_inline)) void block_lane_sums(const v16f (&acc)[R][U], float (&sums)[R * U]) {
  static_assert(R * U <= 16);
  alignas(64) v16f a[R * U];  // alignas: v16f is 4-aligned, but clang addresses array elements with 64-byte-aligned loads
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) a[u * R + r] = acc[r][u];
  if constexpr (R * U <= 4) lane_sums4(a, R * U, sums);
  else lane_sums16(a, R * U, sums);
}

void decode_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b) {
    v16f f1, f2;
    decode_mxfp4_block(packed + b * 16, scales[b], f1, f2);
    store16(dst + b * 32, f1);
    store16(dst + b * 32 + 16, f2);
  }
}

// Fused MXFP4 decode + dot for few tokens (decode, MoE experts): R rows × U tokens, the weights are
// decoded in registers once and never stored. Same per-(row, token) summation order as the
// decode-then-dot path (16-lane partial sums over the row, then a lane sum), so results do not
// depend on which path ran.
template <int R, int U>
void mxfp4_rows_dot(const WeightMatrix& w, int64_t r0, const float* x, float* y, int64_t ldy) {
  const int64_t in = w.in, blocks = in / 32;
  const uint8_t* P = static_cast<const uint8_t*>(w.data);
  alignas(64) v16f acc[R][U];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) acc[r][u] = v16f{};
  for (int64_t b = 0; b < blocks; ++b) {
    alignas(64) v16f x1[U], x2[U];
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) {
      x1[u] = load16(x + u * in + b * 32);
      x2[u] = load16(x + u * in + b * 32 + 16);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      v16f f1, f2;
      decode_mxfp4_block(P + (r0 + r) * (in / 2) + b * 16, w.scales[(r0 + r) * blocks + b], f1, f2);
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) {
        acc[r][u] += f1 * x1[u];
        acc[r][u] += f2 * x2[u];
      }
    }
  }
  float sums[R * U];
  block_lane_sums<R, U>(acc, sums);
#pragma GCC unroll 16
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) y[u * ldy + r0 + r] = sums[u * R + r];
}

}  // namespace

void decode_row(const WeightMatrix& w, int64_t r, float* dst) {
  const int64_t n = w.in;
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* p = static_cast<const float*>(w.data) + r * n;
      std::copy(p, p + n, dst);
      return;
    }
    case WeightFormat::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * n;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) store16(dst + i, load_bf16x16(p + i));
      for (; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * n;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) store16(dst + i, load_f16x16(p + i));
      for (; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case WeightFormat::kMxfp4: {
      decode_mxfp4_row(static_cast<const uint8_t*>(w.data) + r * (n / 2), w.scales + r * (n / 32), n / 32, dst);
      return;
    }
    case WeightFormat::kFp8Block: {
      decode_fp8_block_row(w, r, dst);
      return;
    }
    case WeightFormat::kW4A8: {
      dequantize_int4_row(static_cast<const uint8_t*>(w.data) + r * (n / 2),
                          reinterpret_cast<const uint16_t*>(w.scales) + r * (n / w.group), n, w.group, dst);
      return;
    }
    case WeightFormat::kGgufQ8_0:
    case WeightFormat::kGgufQ4_0:
    case WeightFormat::kGgufMxfp4:
      decode_gguf_row(w, r, dst);
      return;
  }
}

namespace {

// Register-blocked micro-kernel: R fp32 weight rows × U tokens, 16-float vectors (GCC vector
// extensions; one zmm on AVX-512, two ymm on AVX2). R·U independent accumulators keep the FMA
// pipes busy; the tail of `in` (not a multiple of 16) is finished in scalar code.
// Every path below keeps this per-(row, token) summation order: 16-lane partial sums over the row in
// steps of 16, lane sum 0..15 (lane_sums16 / lane_sums4), then the scalar tail (each product rounded,
// then added). So a token's result never depends on which path, block shape or batch it ran in.
using v16 = v16f;

// One step of the scalar tail: s + w·x with the product rounded, then added — never contracted into
// an FMA. (Left to the compiler, -ffp-contract=fast fused it in some loops and not in others — a
// vectorised in-order reduction keeps the multiply separate — so the fused bf16/f16 few-token path
// and the many-token path disagreed in the last bit when `in` % 16 != 0.)
inline float tail_step(float s, float w, float x) {
  float p = w * x;
  asm("" : "+x"(p));  // hides the product from contraction
  return s + p;
}

template <int R, int U>
inline void block_dot(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y, int64_t ys) {
  alignas(64) v16 acc[R][U];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) acc[r][u] = v16{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    alignas(64) v16 xv[U];
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) {
      xv[u] = load16(x + u * xs + i);
#if defined(__AVX512F__)
      __asm__("" : "+v"(xv[u]));
#endif
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      v16 wv = load16(w + r * ws + i);
#if defined(__AVX512F__)
      // In a register: GCC otherwise folds this load into each of the U fmas that use it (on AVX-512, Zen 4:
      // 20 loads of 64 bytes per 16 fmas of a 4 × 4 tile, where 8 suffice).
      __asm__("" : "+v"(wv));
#endif
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) acc[r][u] += wv * xv[u];
    }
  }
  float sums[R * U];
  block_lane_sums<R, U>(acc, sums);
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) {
      float s = sums[u * R + r];
      for (int64_t j = i; j < n; ++j) s = tail_step(s, w[r * ws + j], x[u * xs + j]);
      y[u * ys + r] = s;
    }
}


#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// 8 × 8 transpose: on return v[k] lane j = (input v[j]) lane k.
inline __attribute__((always_inline)) void transpose8(__m256* v) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    const int b = 4 * i;
    u[b] = _mm256_shuffle_ps(t[b], t[b + 2], 0x44);
    u[b + 1] = _mm256_shuffle_ps(t[b], t[b + 2], 0xEE);
    u[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0x44);
    u[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
    v[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
  }
}

// Lane sums of n ≤ 16 accumulators held as halves (lo[j]: lanes 0..7, hi[j]: lanes 8..15) in the fixed
// order out[j] = ((0 + a[j][0]) + a[j][1]) + … + a[j][15]: 8 outputs at a time, transposed so that one
// vector add per lane runs every output's chain at once.
template <int N>
inline __attribute__((always_inline)) void lane_sums_halves(const __m256 (&lo)[N], const __m256 (&hi)[N], float (&out)[N]) {
#pragma GCC unroll 2
  for (int g = 0; g < N; g += 8) {
    __m256 a[8], b[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      a[j] = g + j < N ? lo[g + j] : _mm256_setzero_ps();
      b[j] = g + j < N ? hi[g + j] : _mm256_setzero_ps();
    }
    transpose8(a);
    transpose8(b);
    __m256 s = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) s = _mm256_add_ps(s, a[k]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) s = _mm256_add_ps(s, b[k]);
    float tmp[8];
    _mm256_storeu_ps(tmp, s);
    for (int j = 0; j < std::min(8, N - g); ++j) out[g + j] = tmp[j];
  }
}

#endif

// Decode (one token) over 16-bit weights: R row streams, and a thread's register blocks follow each
// other in memory. One prefetch per 64-byte line (every other 16-element step): the point 1 KiB on in
// the row into L1, and the same point two register blocks (2R rows) on into L2, which follows the read
// pattern at any row length. 16384 × 7168 GEMV, 2 threads, Xeon: 1 KiB none 30.5 GB/s, 256 B 34.9,
// 512 B 39.6, 1 KiB 40.2; the L2 prefetch on 32768 × 2304 rows: docs/PERFORMANCE.md, "Decode prefetch".
constexpr int64_t kHalfPrefetchElems = 512;
__attribute__((always_inline)) inline void prefetch_half_row(const uint16_t* p, int64_t block_elems) {
  __builtin_prefetch(p + kHalfPrefetchElems, 0, 3);
  __builtin_prefetch(p + 2 * block_elems, 0, 2);
}

// Fused 16-bit-float rows × few tokens: R rows of bf16/f16 weights converted in registers (never
// stored), U tokens.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// AVX2: each 16-lane accumulator as two 8-float registers (lanes 0-7, 8-15), the same FMAs per lane in the
// same order, lane sums by transposes in the fixed order. (GCC 12 kept the generic form's 64-byte
// accumulators in memory on AVX2, moving halves through general registers: 11 GB/s on a 16384 × 7168 bf16
// GEMV where fp32 rows ran at 28.)
template <int R, int U, bool kBf16>
void half_rows_dot(const uint16_t* W, int64_t in, int64_t r0, const float* x, float* y, int64_t ldy) {
  __m256 lo[R][U], hi[R][U];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) lo[r][u] = hi[r][u] = _mm256_setzero_ps();
  auto load8 = [](const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kBf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  };
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m256 xl[U], xh[U];
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) xl[u] = _mm256_loadu_ps(x + u * in + i), xh[u] = _mm256_loadu_ps(x + u * in + i + 8);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const uint16_t* p = W + (r0 + r) * in + i;
      if constexpr (U == 1) {
        if ((i & 31) == 0) prefetch_half_row(p, R * in);
      }
      const __m256 wl = load8(p), wh = load8(p + 8);
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) lo[r][u] = _mm256_fmadd_ps(wl, xl[u], lo[r][u]), hi[r][u] = _mm256_fmadd_ps(wh, xh[u], hi[r][u]);
    }
  }
  __m256 L[R * U], H[R * U];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) L[u * R + r] = lo[r][u], H[u * R + r] = hi[r][u];
  float sums[R * U];
  lane_sums_halves<R * U>(L, H, sums);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      float s = sums[u * R + r];
      for (int64_t j = i; j < in; ++j) {
        const uint16_t h = W[(r0 + r) * in + j];
        s = tail_step(s, kBf16 ? bf16_to_f32(h) : f16_to_f32(h), x[u * in + j]);
      }
      y[u * ldy + r0 + r] = s;
    }
}
#else
template <int R, int U, bool kBf16>
void half_rows_dot(const uint16_t* W, int64_t in, int64_t r0, const float* x, float* y, int64_t ldy) {
  alignas(64) v16 acc[R][U];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) acc[r][u] = v16{};
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    alignas(64) v16 xv[U];
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) xv[u] = load16(x + u * in + i);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const uint16_t* p = W + (r0 + r) * in + i;
      if constexpr (U == 1) {
        if ((i & 31) == 0) prefetch_half_row(p, R * in);
      }
      const v16 wv = kBf16 ? load_bf16x16(p) : load_f16x16(p);
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) acc[r][u] += wv * xv[u];
    }
  }
  float sums[R * U];
  block_lane_sums<R, U>(acc, sums);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      float s = sums[u * R + r];
      for (int64_t j = i; j < in; ++j) {
        const uint16_t h = W[(r0 + r) * in + j];
        s = tail_step(s, kBf16 ? bf16_to_f32(h) : f16_to_f32(h), x[u * in + j]);
      }
      y[u * ldy + r0 + r] = s;
    }
}

#endif

void many_tokens_rows(const WeightMatrix& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1);

// Decode-time shapes (T ≤ 4): every format runs fused, weights read once from memory.
template <int U>
void few_tokens_rows(const WeightMatrix& w, const float* x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t in = w.in;
  int64_t r = r0;
  switch (w.format) {
    case WeightFormat::kMxfp4:
      for (; r + 4 <= r1; r += 4) mxfp4_rows_dot<4, U>(w, r, x, y, ldy);
      for (; r < r1; ++r) mxfp4_rows_dot<1, U>(w, r, x, y, ldy);
      return;
    case WeightFormat::kBF16:
    case WeightFormat::kF16: {
      const auto* W = static_cast<const uint16_t*>(w.data);
      const bool bf = w.format == WeightFormat::kBF16;
      for (; r + 4 <= r1; r += 4)
        bf ? half_rows_dot<4, U, true>(W, in, r, x, y, ldy) : half_rows_dot<4, U, false>(W, in, r, x, y, ldy);
      for (; r < r1; ++r)
        bf ? half_rows_dot<1, U, true>(W, in, r, x, y, ldy) : half_rows_dot<1, U, false>(W, in, r, x, y, ldy);
      return;
    }
    case WeightFormat::kF32: {
      const float* W = static_cast<const float*>(w.data);
      for (; r + 4 <= r1; r += 4) block_dot<4, U>(W + r * in, in, x, in, in, y + r, ldy);
      for (; r < r1; ++r) block_dot<1, U>(W + r * in, in, x, in, in, y + r, ldy);
      return;
    }
    default:  // formats without a fused path: decode rows, then the same dot
      many_tokens_rows(w, x, U, y, ldy, r0, r1);
      return;
  }
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// AVX2: block_dot's per-(row, token) arithmetic on 8-float registers. A v16 accumulator's lanes are
// independent chains, so lanes 0..7 (elements i ≡ 0..7 mod 16) run in one pass over the row and lanes
// 8..15 in a second; each lane sees the same FMAs in the same order as in block_dot, and the halves are
// put back together for the same lane sum and tail. R·U accumulators in 8-float registers (12 for the
// 4 × 3 tile, plus U token vectors and one weight vector: the 16 ymm registers) instead of 2·R·U
// (32 for block_dot<4, 4>, which spills on AVX2).
// The R × U tile's accumulators as floats in memory: [half][u·R + r][8 lanes] (lanes 0-7 / 8-15 of each v16).
template <int R, int U>
constexpr int64_t kTileAccFloats = 2 * R * U * 8;

// Advances a tile's accumulators over elements [i0, i1) (multiples of 16): lanes 0-7 of every 16-element
// step in one pass, lanes 8-15 in a second; each lane sees block_dot's FMAs in block_dot's order.
template <int R, int U>
inline void block_fma_halves(const float* w, int64_t ws, const float* x, int64_t xs, int64_t i0, int64_t i1, float* acc) {
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    __m256 a[R][U];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) a[r][u] = _mm256_loadu_ps(acc + ((half * U + u) * R + r) * 8);
    for (int64_t i = i0 + 8 * half; i < i1; i += 16) {
      __m256 xv[U];
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) {
        xv[u] = _mm256_loadu_ps(x + u * xs + i);
        KESTREL_IN_REGISTER(xv[u]);
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        __m256 wv = _mm256_loadu_ps(w + r * ws + i);
        KESTREL_IN_REGISTER(wv);
#pragma GCC unroll 16
        for (int u = 0; u < U; ++u) a[r][u] = _mm256_fmadd_ps(wv, xv[u], a[r][u]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) _mm256_storeu_ps(acc + ((half * U + u) * R + r) * 8, a[r][u]);
  }
}

// y of the tile from its accumulators: the lane sums in the fixed order, then the scalar tail [n16, n).
template <int R, int U>
inline void block_finish_halves(const float* acc, const float* w, int64_t ws, const float* x, int64_t xs, int64_t n16, int64_t n,
                                float* y, int64_t ys) {
  __m256 lo[R * U], hi[R * U];
#pragma GCC unroll 16
  for (int j = 0; j < R * U; ++j) lo[j] = _mm256_loadu_ps(acc + j * 8), hi[j] = _mm256_loadu_ps(acc + (R * U + j) * 8);
  float sums[R * U];
  lane_sums_halves<R * U>(lo, hi, sums);
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) {
      float s = sums[u * R + r];
      for (int64_t j = n16; j < n; ++j) s = tail_step(s, w[r * ws + j], x[u * xs + j]);
      y[u * ys + r] = s;
    }
}

// AVX2: block_dot's per-(row, token) arithmetic on 8-float registers. A v16 accumulator's lanes are
// independent chains, so lanes 0..7 (elements i ≡ 0..7 mod 16) run in one pass over the row and lanes
// 8..15 in a second; each lane sees the same FMAs in the same order as in block_dot, and the halves are
// put back together for the same lane sum and tail. R·U accumulators in 8-float registers (12 for the
// 4 × 3 tile, plus U token vectors and one weight vector: the 16 ymm registers) instead of 2·R·U
// (32 for block_dot<4, 4>, which spills on AVX2).
template <int R, int U>
inline void block_dot_halves(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y, int64_t ys) {
  const int64_t n16 = n / 16 * 16;
  alignas(32) float acc[kTileAccFloats<R, U>] = {};
  block_fma_halves<R, U>(w, ws, x, xs, 0, n16, acc);
  block_finish_halves<R, U>(acc, w, ws, x, xs, n16, n, y, ys);
}
constexpr int kTileRows = 4, kTileTokens = 3;
template <int R, int U>
inline void tile_dot(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y, int64_t ys) {
  block_dot_halves<R, U>(w, ws, x, xs, n, y, ys);
}
#else
constexpr int kTileRows = 4, kTileTokens = 4;
template <int R, int U>
inline void tile_dot(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y, int64_t ys) {
  block_dot<R, U>(w, ws, x, xs, n, y, ys);
}
#endif

// Prefill / batched shapes (T > 4): the rows are taken a panel at a time (a block of rows sized to stay in
// L2: decoded once into a per-thread buffer, or used in place when they are fp32), and within the panel
// token-block by token-block, each token block meeting every row of the panel. So the tokens stream once
// per panel, not once per 4 rows (with T = 512 and in = 512 that was 1 MB of activations re-read for
// every 4 output rows). Each (row, token) pair still runs the one fixed order (tile_dot = block_dot's).
constexpr int64_t kPanelBytes = 96 * 1024;
[[maybe_unused]] constexpr int64_t kKBlock = 1024;  // AVX2: elements of a row per K-block (panel_times_tokens_kblocked)

int64_t panel_rows(int64_t in) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
  in = std::min<int64_t>(in, kKBlock);  // long rows run in K-blocks (panel_times_tokens_kblocked)
#endif
  const int64_t rows = kPanelBytes / (in * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(rows / kTileRows * kTileRows, kTileRows, 64);
}

// The floats of that buffer a product of `w` on the fp32 path may use (0: weights used in place).
size_t decoded_rows_floats(const WeightMatrix& w) {
  return w.format == WeightFormat::kF32 ? 0 : static_cast<size_t>(panel_rows(w.in) * w.in);
}

// y[t, r0 + k] for k < n and every token, rows already in fp32 (`rows` [n, in]).
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// Long rows (in > kKBlock): a tile's 3 token rows no longer stay in L1 (in = 7168: 84 KiB), so the panel
// runs K-block by K-block (kKBlock elements of every row), token block by token block (kTokBlock tokens),
// the tiles' accumulators kept in a per-thread buffer between K-blocks. A lane still adds its products
// in element order (K-blocks in order), so every (row, token) keeps block_dot's bits.
constexpr int64_t kTokBlock = 24;

void panel_times_tokens_kblocked(const float* rows, int64_t n, int64_t in, const float* x, int64_t T, float* y, int64_t ldy,
                                 int64_t r0) {
  constexpr int R = kTileRows, U = kTileTokens;
  constexpr int64_t S = kTileAccFloats<R, U>;  // floats per tile slot (the largest tile's)
  const int64_t full = n / R * R, n_tiles = full / R + (n - full), n16 = in / 16 * 16;
  const int64_t groups = kTokBlock / U + kTokBlock % U + 1;
  float* acc = thread_scratch(kScratchLinearAcc, static_cast<size_t>(groups * n_tiles * S));
  for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
    const int64_t t1 = std::min(T, t0 + kTokBlock), tf = t0 + (t1 - t0) / U * U;
    const int64_t n_groups = (tf - t0) / U + (t1 - tf);
    std::fill(acc, acc + n_groups * n_tiles * S, 0.0f);
    // Each (token group, row tile) pair: its slot, its tile shape.
    auto each = [&](auto&& f) {
      int64_t g = 0;
      for (int64_t t = t0; t < tf; t += U, ++g) {
        for (int64_t k = 0, i = 0; k < full; k += R, ++i) f(std::integral_constant<int, R>{}, std::integral_constant<int, U>{}, t, k, g * n_tiles + i);
        for (int64_t k = full, i = full / R; k < n; ++k, ++i) f(std::integral_constant<int, 1>{}, std::integral_constant<int, U>{}, t, k, g * n_tiles + i);
      }
      for (int64_t t = tf; t < t1; ++t, ++g) {
        for (int64_t k = 0, i = 0; k < full; k += R, ++i) f(std::integral_constant<int, R>{}, std::integral_constant<int, 1>{}, t, k, g * n_tiles + i);
        for (int64_t k = full, i = full / R; k < n; ++k, ++i) f(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{}, t, k, g * n_tiles + i);
      }
    };
    for (int64_t k0 = 0; k0 < n16; k0 += kKBlock) {
      const int64_t k1 = std::min(n16, k0 + kKBlock);
      each([&](auto r, auto u, int64_t t, int64_t k, int64_t slot) {
        block_fma_halves<decltype(r)::value, decltype(u)::value>(rows + k * in, in, x + t * in, in, k0, k1, acc + slot * S);
      });
    }
    each([&](auto r, auto u, int64_t t, int64_t k, int64_t slot) {
      block_finish_halves<decltype(r)::value, decltype(u)::value>(acc + slot * S, rows + k * in, in, x + t * in, in, n16, in,
                                                                  y + t * ldy + r0 + k, ldy);
    });
  }
}
#endif

void panel_times_tokens(const float* rows, int64_t n, int64_t in, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
  if (in > kKBlock) return panel_times_tokens_kblocked(rows, n, in, x, T, y, ldy, r0);
#endif
  constexpr int R = kTileRows, U = kTileTokens;
  const int64_t full = n / R * R;
  int64_t t = 0;
  for (; t + U <= T; t += U) {
    const float* xt = x + t * in;
    float* yt = y + t * ldy + r0;
    for (int64_t k = 0; k < full; k += R) tile_dot<R, U>(rows + k * in, in, xt, in, in, yt + k, ldy);
    for (int64_t k = full; k < n; ++k) tile_dot<1, U>(rows + k * in, in, xt, in, in, yt + k, ldy);
  }
  for (; t < T; ++t) {
    const float* xt = x + t * in;
    float* yt = y + t * ldy + r0;
    for (int64_t k = 0; k < full; k += R) tile_dot<R, 1>(rows + k * in, in, xt, in, in, yt + k, ldy);
    for (int64_t k = full; k < n; ++k) tile_dot<1, 1>(rows + k * in, in, xt, in, in, yt + k, ldy);
  }
}

void many_tokens_rows(const WeightMatrix& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t in = w.in, P = panel_rows(in);
  float* buf = w.format == WeightFormat::kF32 ? nullptr : thread_scratch(kScratchLinear, decoded_rows_floats(w));
  for (int64_t r = r0; r < r1; r += P) {
    const int64_t n = std::min(r1, r + P) - r;
    const float* rows;
    if (buf == nullptr) {
      rows = static_cast<const float*>(w.data) + r * in;
    } else {
      for (int64_t k = 0; k < n; ++k) decode_row(w, r + k, buf + k * in);
      rows = buf;
    }
    panel_times_tokens(rows, n, in, x, T, y, ldy, r);
  }
}

}  // namespace

void matmul_rows(const WeightMatrix& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  switch (T) {
    case 0: return;
    case 1: return few_tokens_rows<1>(w, x, y, ldy, r0, r1);
    case 2: return few_tokens_rows<2>(w, x, y, ldy, r0, r1);
    case 3: return few_tokens_rows<3>(w, x, y, ldy, r0, r1);
    case 4: return few_tokens_rows<4>(w, x, y, ldy, r0, r1);
    default: return many_tokens_rows(w, x, T, y, ldy, r0, r1);
  }
}

namespace {

// Which activation quantization a product runs with (none: fp32 activations, matmul_rows).
//   kPerToken: W4A8 unless weight-only mode, MXFP4 when opted in (w4a8_gemm.h);
//   kQ8Blocks: GGUF Q4_0 / Q8_0 / MXFP4 in the default int8 mode (gguf_int8.h).
//   kBf16: BF16 weights flagged act_bf16 (GGUF, or KESTREL_BF16_ACTS=1) in the default GGUF mode (bf16_dot.h).
enum class ActKind : uint8_t { kNone, kPerToken, kQ8Blocks, kBf16 };

ActKind act_kind(const WeightMatrix& w) {
  if (gguf_int8_applies(w)) return ActKind::kQ8Blocks;
  if (bf16_dot_applies(w)) return ActKind::kBf16;
  if ((w.format == WeightFormat::kW4A8 && !w4a8_weight_only()) || (w.format == WeightFormat::kMxfp4 && mxfp4_int8_enabled()))
    return ActKind::kPerToken;
  return ActKind::kNone;
}

// The quantized inputs of one matmul_many call: one entry per distinct (x, T, in, kind), so products
// sharing an input (q/k/v, gate/up) quantize it once. Per calling thread; buffers only grow.
struct QuantInputs {
  struct Input {
    const float* x;
    int64_t T, in;
    ActKind kind;
    size_t slot;  // index into q8 or tok
  };
  std::vector<Input> inputs;
  std::vector<Q8Acts> q8;
  std::vector<QuantizedActs> tok;
  std::vector<Bf16Acts> bf;
  std::vector<int32_t> task_input;  // per task: index into inputs, −1 for fp32 products
  size_t n_q8 = 0, n_tok = 0, n_bf = 0;

  void clear() { inputs.clear(), task_input.clear(), n_q8 = n_tok = n_bf = 0; }
  // `w`: the product's weights (a Q4_0 / Q8_0 / MXFP4 product adds the layout its kernel reads to a Q8
  // input: the packed kernels' Q4_0 layout for Q4_0 and packed MXFP4, gguf_int8_layout).
  int32_t add(const float* x, int64_t T, int64_t in, ActKind kind, const WeightMatrix& w) {
    const Q8Layouts l = kind == ActKind::kQ8Blocks ? gguf_int8_layout(w, T) : Q8Layouts{};
    const bool q4 = l.q4, q8f = l.q8, mx = l.mx;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].x == x && inputs[i].T == T && inputs[i].in == in && inputs[i].kind == kind) {
        if (kind == ActKind::kQ8Blocks) {
          Q8Acts& a = q8[inputs[i].slot];
          if ((q4 && !a.gemm_q4) || (q8f && !a.gemm_q8) || (mx && !a.gemm_mx))
            q8_acts_prepare(a, T, in, a.gemm_q4 || q4, a.gemm_q8 || q8f, a.gemm_mx || mx);
        }
        return static_cast<int32_t>(i);
      }
    size_t slot;
    if (kind == ActKind::kQ8Blocks) {
      if (q8.size() <= n_q8) q8.emplace_back();
      slot = n_q8++;
      q8_acts_prepare(q8[slot], T, in, q4, q8f, mx);
    } else if (kind == ActKind::kBf16) {
      if (bf.size() <= n_bf) bf.emplace_back();
      slot = n_bf++;
      bf16_acts_prepare(bf[slot], T, in);
    } else {
      if (tok.size() <= n_tok) tok.emplace_back();
      slot = n_tok++;
      quantize_activations(x, T, in, tok[slot]);  // per-token layout: serial (small next to the product)
    }
    inputs.push_back({x, T, in, kind, slot});
    return static_cast<int32_t>(inputs.size() - 1);
  }
};

// Token ranges of the Q8 inputs, quantized in parallel before the products run.
struct QuantPiece {
  int32_t input;
  int64_t t0, t1;
};

struct Chunk {
  int32_t task;
  int64_t r0, r1;
};

// Rough cost of one output row: weight bytes streamed (~5 FMA-token slots per byte at 16 GB/s per
// core) plus one FMA per token and input element (an int8 MAC counts a quarter). Only used to cut
// chunks of similar size.
double row_cost(const MatmulTask& t, bool int8) {
  double bytes = 4;
  switch (t.w->format) {
    case WeightFormat::kF32: bytes = 4; break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16: bytes = 2; break;
    case WeightFormat::kMxfp4: bytes = 17.0 / 32.0; break;
    case WeightFormat::kGgufQ4_0: bytes = 18.0 / 32.0; break;
    case WeightFormat::kGgufMxfp4: bytes = 17.0 / 32.0; break;
    case WeightFormat::kW4A8: bytes = 0.5625; break;
    default: bytes = 1; break;  // 8-bit formats
  }
  return static_cast<double>(t.w->in) * (5.0 * bytes + static_cast<double>(t.T) * (int8 ? 0.25 : 1.0));
}

void run_chunk(const MatmulTask& t, const QuantInputs& in8, int32_t input, int64_t r0, int64_t r1) {
  const int64_t ldy = t.ldy ? t.ldy : t.w->out;
  if (input < 0) return matmul_rows(*t.w, t.x, t.T, t.y, ldy, r0, r1);
  const QuantInputs::Input& q = in8.inputs[static_cast<size_t>(input)];
  if (q.kind == ActKind::kQ8Blocks) {
    const Q8Acts& a = in8.q8[q.slot];
    return gguf_int8_product(*t.w, a, t.y, ldy, r0, r1);
  }
  if (q.kind == ActKind::kBf16) return bf16_dot_rows(*t.w, in8.bf[q.slot], t.y, ldy, r0, r1);
  int8_matmul_rows(*t.w, in8.tok[q.slot], t.y, ldy, r0, r1);
}

}  // namespace

void matmul_many(std::span<const MatmulTask> tasks) {
  // (thread_local: the calling thread's buffers; the parallel region below must use this reference,
  // not the name, which would resolve to each worker's own empty instance.)
  thread_local QuantInputs in8_local;
  QuantInputs& in8 = in8_local;
  in8.clear();
  double total = 0;
  for (const MatmulTask& t : tasks) {
    KCHECK(t.w != nullptr && t.T >= 0 && (t.ldy == 0 || t.ldy >= t.w->out), "bad matmul task");
    KCHECK(t.w->format != WeightFormat::kMxfp4 || (t.w->in % 32 == 0 && t.w->scales != nullptr), "bad MXFP4 matrix");
    const ActKind kind = t.T > 0 ? act_kind(*t.w) : ActKind::kNone;
    in8.task_input.push_back(kind == ActKind::kNone ? -1 : in8.add(t.x, t.T, t.w->in, kind, *t.w));
    total += row_cost(t, kind != ActKind::kNone) * static_cast<double>(t.w->out);
  }
  // Row-decode buffer every thread may need below: sized by each thread as it enters the region, so which
  // thread's first chunk of the widest product comes when (dynamic schedule) never decides whether a
  // later step allocates.
  size_t decode_floats = 0;
  for (size_t i = 0; i < tasks.size(); ++i)
    if (in8.task_input[i] < 0 && tasks[i].T > 0) decode_floats = std::max(decode_floats, decoded_rows_floats(*tasks[i].w));
  thread_local std::vector<QuantPiece> pieces;
  pieces.clear();
  for (size_t i = 0; i < in8.inputs.size(); ++i) {
    const QuantInputs::Input& q = in8.inputs[i];
    if (q.kind != ActKind::kQ8Blocks && q.kind != ActKind::kBf16) continue;
    const int64_t step = std::max<int64_t>(1, 65536 / q.in);  // ~64K elements per piece
    for (int64_t t0 = 0; t0 < q.T; t0 += step) pieces.push_back({static_cast<int32_t>(i), t0, std::min(q.T, t0 + step)});
  }
  auto quantize_piece = [&](const QuantPiece& p) {
    const QuantInputs::Input& q = in8.inputs[static_cast<size_t>(p.input)];
    if (q.kind == ActKind::kBf16) return bf16_acts_fill(q.x, p.t0, p.t1, in8.bf[q.slot]);
    q8_acts_fill(q.x, p.t0, p.t1, in8.q8[q.slot]);
  };
  const int threads = omp_get_max_threads();
  // Small products (tiny models, routers) are not worth a fork/join.
  if (threads == 1 || total < 6e4 || omp_in_parallel()) {
    for (const QuantPiece& p : pieces) quantize_piece(p);
    for (size_t i = 0; i < tasks.size(); ++i) run_chunk(tasks[i], in8, in8.task_input[i], 0, tasks[i].w->out);
    return;
  }
  // ~6 chunks per thread: enough slack for dynamic balancing, few enough to stay cheap.
  thread_local std::vector<Chunk> chunks;
  chunks.clear();
  const double target = total / (6.0 * threads);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const MatmulTask& t = tasks[i];
    const int64_t out = t.w->out;
    int64_t rows = static_cast<int64_t>(target / row_cost(t, in8.task_input[i] >= 0));
    const int64_t align = t.w->packed != nullptr ? 16 : 4;  // packed Q4_0 / MXFP4: whole 16-row groups per chunk
    rows = std::clamp<int64_t>((rows + align - 1) / align * align, align, std::max<int64_t>(align, out));
    for (int64_t r = 0; r < out; r += rows) chunks.push_back({static_cast<int32_t>(i), r, std::min(out, r + rows)});
  }
  const Chunk* c = chunks.data();
  const QuantPiece* pc = pieces.data();
  const int64_t n = static_cast<int64_t>(chunks.size()), np = static_cast<int64_t>(pieces.size());
#pragma omp parallel
  {
    if (decode_floats > 0) thread_scratch(kScratchLinear, decode_floats);
    if (np > 0) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < np; ++k) quantize_piece(pc[k]);
    }  // (implicit barrier: every input is quantized before any product reads it)
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t k = 0; k < n; ++k) {
      const MatmulTask& t = tasks[static_cast<size_t>(c[k].task)];
      run_chunk(t, in8, in8.task_input[static_cast<size_t>(c[k].task)], c[k].r0, c[k].r1);
    }
  }
}

void matmul(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  const MatmulTask t{&w, x, T, y, 0};
  matmul_many(std::span<const MatmulTask>(&t, 1));
}

void matmul_reference(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  std::vector<float> row(static_cast<size_t>(w.in));
  for (int64_t r = 0; r < w.out; ++r) {
    decode_row(w, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t i = 0; i < w.in; ++i) s += static_cast<double>(row[static_cast<size_t>(i)]) * x[t * w.in + i];
      y[t * w.out + r] = static_cast<float>(s);
    }
  }
}

}  // namespace kestrel::kernels
