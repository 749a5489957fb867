#include "kernels/cpu/linear_fp8.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef int32_t v16i32 __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64), aligned(4)));

// 16 E4M3 bytes → fp32 × s, branch-free (GCC vector extensions; zmm on AVX-512, 2×ymm on AVX2).
// |code| = eeee mmm: normal (e > 0) → fp32 bits (e + 120) << 23 | m << 20, i.e. 2^(e−7)·(1 + m/8);
// subnormal (e = 0) → m · 2^−9; 0x7f → NaN (the fn variant has no infinities). Sign = bit 7.
inline v16f decode16(const uint8_t* q, float s) {
  v16i32 b;
#if defined(__AVX512F__)
  // maskz form: the unmasked intrinsic trips GCC 12 -Wmaybe-uninitialized in its header.
  const __m512i w = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  std::memcpy(&b, &w, 64);
#else  // GCC scalarises a direct u8 → i32 vector conversion; fine off the AVX-512 path
  v16u8 b8;
  std::memcpy(&b8, q, 16);
  b = __builtin_convertvector(b8, v16i32);
#endif
  const v16i32 m = b & 0x7f;
  const v16i32 normal_bits = (m << 20) + (120 << 23);
  v16f normal, mag;
  std::memcpy(&normal, &normal_bits, 64);
  const v16f sub = __builtin_convertvector(m, v16f) * 0.001953125f;
  mag = m < 8 ? sub : normal;
  mag = m == 0x7f ? v16f{} + NAN : mag;
  v16i32 bits;
  std::memcpy(&bits, &mag, 64);
  bits |= (b & 0x80) << 24;
  v16f out;
  std::memcpy(&out, &bits, 64);
  return out * s;
}

}  // namespace

void decode_fp8_block_row(const WeightMatrix& w, int64_t r, float* dst) {
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * w.in;
  const int64_t kb = fp8_blocks(w.in);
  // scale_inv may sit at any byte offset: read each value with memcpy.
  const uint8_t* srow = w.scales + static_cast<size_t>((r / kFp8Block) * kb) * sizeof(float);
  for (int64_t b = 0; b < kb; ++b) {
    float s;
    std::memcpy(&s, srow + b * sizeof(float), sizeof(float));
    const int64_t j0 = b * kFp8Block, j1 = j0 + kFp8Block < w.in ? j0 + kFp8Block : w.in;
    int64_t j = j0;
    for (; j + 16 <= j1; j += 16) {
      const v16f v = decode16(q + j, s);
      std::memcpy(dst + j, &v, 64);
    }
    for (; j < j1; ++j) dst[j] = f8e4m3_to_f32(q[j]) * s;  // row tail (in not a multiple of 16)
  }
}

}  // namespace kestrel::kernels
