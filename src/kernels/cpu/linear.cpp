#include "kernels/cpu/linear.h"

#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/scratch.h"

namespace kestrel::kernels {
namespace {

}  // namespace

namespace {

typedef int8_t v16i8 __attribute__((vector_size(16)));
typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i32 __attribute__((vector_size(64)));

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

void decode_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b) {
    v16f f1, f2;
    decode_mxfp4_block(packed + b * 16, scales[b], f1, f2);
    std::memcpy(dst + b * 32, &f1, 64);
    std::memcpy(dst + b * 32 + 16, &f2, 64);
  }
}

// Fused MXFP4 decode + dot for few tokens (decode, MoE experts): R rows × U tokens, the weights are
// decoded in registers once and never stored. Same per-(row, token) summation order as the
// decode-then-dot path (16-lane partial sums over the row, then a lane sum), so results do not
// depend on which path ran.
template <int R, int U>
void mxfp4_rows_dot(const WeightMatrix& w, int64_t r0, const float* x, float* y, int64_t out) {
  const int64_t in = w.in, blocks = in / 32;
  const uint8_t* P = static_cast<const uint8_t*>(w.data);
  v16f acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = v16f{};
  for (int64_t b = 0; b < blocks; ++b) {
    v16f x1[U], x2[U];
    for (int u = 0; u < U; ++u) {
      std::memcpy(&x1[u], x + u * in + b * 32, 64);
      std::memcpy(&x2[u], x + u * in + b * 32 + 16, 64);
    }
    for (int r = 0; r < R; ++r) {
      v16f f1, f2;
      decode_mxfp4_block(P + (r0 + r) * (in / 2) + b * 16, w.scales[(r0 + r) * blocks + b], f1, f2);
      for (int u = 0; u < U; ++u) {
        acc[r][u] += f1 * x1[u];
        acc[r][u] += f2 * x2[u];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      float s = 0;
      for (int k = 0; k < 16; ++k) s += acc[r][u][k];
      y[u * out + r0 + r] = s;
    }
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
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case WeightFormat::kMxfp4: {
      decode_mxfp4_row(static_cast<const uint8_t*>(w.data) + r * (n / 2), w.scales + r * (n / 32), n / 32, dst);
      return;
    }
    case WeightFormat::kGgufQ8_0:
    case WeightFormat::kGgufQ4_0:
    case WeightFormat::kGgufMxfp4:
      decode_gguf_row(w, r, dst);
      return;
  }
}

// Register-blocked micro-kernel: R decoded weight rows × U tokens, 16-float vectors (GCC vector
// extensions; one zmm on AVX-512, two ymm on AVX2). R·U independent accumulators keep the FMA
// pipes busy; the tail of `in` (not a multiple of 16) is finished in scalar code.
typedef float v16 __attribute__((vector_size(64), aligned(4)));

template <int R, int U>
inline void block_dot(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y, int64_t ys) {
  v16 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = v16{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v16 xv[U];
    for (int u = 0; u < U; ++u) std::memcpy(&xv[u], x + u * xs + i, 64);
    for (int r = 0; r < R; ++r) {
      v16 wv;
      std::memcpy(&wv, w + r * ws + i, 64);
      for (int u = 0; u < U; ++u) acc[r][u] += wv * xv[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) {
      float s = 0;
      for (int k = 0; k < 16; ++k) s += acc[r][u][k];
      for (int64_t j = i; j < n; ++j) s += w[r * ws + j] * x[u * xs + j];
      y[u * ys + r] = s;
    }
}

// y[t, r0..r0+R) for all tokens, rows already decoded into `rows` [R, in].
template <int R>
void rows_times_tokens(const float* rows, int64_t in, const float* x, int64_t T, float* y, int64_t out, int64_t r0) {
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) block_dot<R, 4>(rows, in, x + t * in, in, in, y + t * out + r0, out);
  for (; t < T; ++t) block_dot<R, 1>(rows, in, x + t * in, in, in, y + t * out + r0, out);
}

// MXFP4 with few tokens: rows split across threads, decoded in registers (no fp32 row buffer).
template <int U>
void mxfp4_matmul_fused(const WeightMatrix& w, const float* x, float* y) {
  const int64_t out = w.out;
  const int64_t blocks4 = out / 4;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks4; ++b) mxfp4_rows_dot<4, U>(w, b * 4, x, y, out);
  for (int64_t r = blocks4 * 4; r < out; ++r) mxfp4_rows_dot<1, U>(w, r, x, y, out);
}

void matmul(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  KCHECK(w.format != WeightFormat::kMxfp4 || (w.in % 32 == 0 && w.scales != nullptr), "bad MXFP4 matrix");
  const int64_t out = w.out, in = w.in;
  if (w.format == WeightFormat::kMxfp4 && T <= 4) {
    switch (T) {
      case 1: return mxfp4_matmul_fused<1>(w, x, y);
      case 2: return mxfp4_matmul_fused<2>(w, x, y);
      case 3: return mxfp4_matmul_fused<3>(w, x, y);
      case 4: return mxfp4_matmul_fused<4>(w, x, y);
      default: break;
    }
  }
  // Decode a block of rows once per thread (fp32 weights are used in place), then use it for every
  // token: weights are read from memory once per call.
  constexpr int64_t kRows = 4;
  const int64_t blocks = (out + kRows - 1) / kRows;
#pragma omp parallel
  {
    float* buf = w.format == WeightFormat::kF32 ? nullptr : thread_scratch(kScratchLinear, static_cast<size_t>(kRows * in));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRows, n = std::min(out, r0 + kRows) - r0;
      const float* rows;
      if (buf == nullptr) {
        rows = static_cast<const float*>(w.data) + r0 * in;
      } else {
        for (int64_t r = 0; r < n; ++r) decode_row(w, r0 + r, buf + r * in);
        rows = buf;
      }
      if (n == kRows) {
        rows_times_tokens<kRows>(rows, in, x, T, y, out, r0);
      } else {
        for (int64_t r = 0; r < n; ++r) rows_times_tokens<1>(rows + r * in, in, x, T, y, out, r0 + r);
      }
    }
  }
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
