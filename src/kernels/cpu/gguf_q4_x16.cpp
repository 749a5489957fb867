#include "kernels/cpu/gguf_q4_x16.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/linear_gguf.h"

namespace kestrel::kernels {
namespace {

// Packs the ggml rows of w (blocks of bb bytes: `sb` scale bytes, then 16 code bytes) into dst. Each row's
// scale bytes go to sb·i of its block's scale region, so Q4_0 (sb = 2) fills [0, 32) and MXFP4 (sb = 1)
// [0, 16), the rest staying zero.
void pack_x16(const WeightMatrix& w, uint8_t* dst, int64_t sb) {
  const int64_t nb = w.in / kGgufBlock, groups = (w.out + kQ4x16Rows - 1) / kQ4x16Rows, bb = sb + 16;
  const auto* src = static_cast<const uint8_t*>(w.data);
  // Groups are independent (a model's load packs gigabytes: both cores share it).
#pragma omp parallel for schedule(static) if (groups * nb > 4096 && !omp_in_parallel())
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* gd = dst + g * nb * kQ4x16BlockBytes;
    const int64_t rows = std::min(kQ4x16Rows, w.out - g * kQ4x16Rows);
    if (rows < kQ4x16Rows) std::memset(gd, 0, static_cast<size_t>(nb * kQ4x16BlockBytes));  // rows past out: zero
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = gd + b * kQ4x16BlockBytes;
      if (sb == 1) std::memset(blk + 16, 0, 16);  // MXFP4: the scale region's second half
      for (int64_t i = 0; i < rows; ++i) {
        const uint8_t* s = src + ((g * kQ4x16Rows + i) * nb + b) * bb;
        std::memcpy(blk + sb * i, s, static_cast<size_t>(sb));
        for (int u = 0; u < 4; ++u) std::memcpy(blk + 32 + 64 * u + 4 * i, s + sb + 4 * u, 4);
      }
    }
  }
}

}  // namespace

int64_t q4_x16_bytes(int64_t out, int64_t in) {
  return (out + kQ4x16Rows - 1) / kQ4x16Rows * (in / kGgufBlock) * kQ4x16BlockBytes;
}

void pack_q4_0_x16(const WeightMatrix& w, uint8_t* dst) {
  KCHECK(w.format == WeightFormat::kGgufQ4_0 && w.in % kGgufBlock == 0 && w.data != nullptr,
         "pack_q4_0_x16: needs a GGUF Q4_0 matrix with in % 32 == 0");
  pack_x16(w, dst, 2);
}

AlignedVector<uint8_t> pack_q4_0_x16(const WeightMatrix& w) {
  AlignedVector<uint8_t> v(static_cast<size_t>(q4_x16_bytes(w.out, w.in)));
  pack_q4_0_x16(w, v.data());
  return v;
}

void pack_mxfp4_x16(const WeightMatrix& w, uint8_t* dst) {
  KCHECK(w.format == WeightFormat::kGgufMxfp4 && w.in % kGgufBlock == 0 && w.data != nullptr,
         "pack_mxfp4_x16: needs a GGUF MXFP4 matrix with in % 32 == 0");
  pack_x16(w, dst, 1);
}

AlignedVector<uint8_t> pack_mxfp4_x16(const WeightMatrix& w) {
  AlignedVector<uint8_t> v(static_cast<size_t>(q4_x16_bytes(w.out, w.in)));
  pack_mxfp4_x16(w, v.data());
  return v;
}

WeightMatrix x16_row_view(const WeightMatrix& w, int64_t r0, int64_t n) {
  KCHECK(x16_format(w.format) && r0 >= 0 && n >= 0 && r0 + n <= w.out, "x16_row_view: bad rows");
  KCHECK(w.packed == nullptr || r0 % kQ4x16Rows == 0, "x16_row_view: packed rows start at a multiple of 16");
  WeightMatrix v = w;
  v.out = n;
  v.data = static_cast<const uint8_t*>(w.data) + r0 * (w.in / kGgufBlock) * gguf_block_bytes(w.format);
  if (w.packed != nullptr) v.packed = w.packed + (r0 / kQ4x16Rows) * (w.in / kGgufBlock) * kQ4x16BlockBytes;
  return v;
}

void q4_x16_rows_model(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
  KCHECK(x16_format(w.format) && w.in == a.in, "q4_x16_rows_model: format or shape mismatch");
  const bool mx = w.format == WeightFormat::kGgufMxfp4;
  const int64_t nb = a.nb, P = a.nc * 128, bb = gguf_block_bytes(w.format);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tok ? tok[i] : i;
    const int8_t* q = a.q.data() + t * P;
    const float* dx = a.d.data() + t * (P / 32);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * nb * bb;
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bb;
        const int8_t* qb = q + b * 32;
        int32_t isum = 0;
        float dw;
        if (mx) {
          for (int j = 0; j < 16; ++j)
            isum += kGgufE2M1Doubled[blk[1 + j] & 15] * qb[j] + kGgufE2M1Doubled[blk[1 + j] >> 4] * qb[j + 16];
          dw = gguf_e8m0_half(blk[0]);
        } else {
          for (int j = 0; j < 16; ++j) isum += ((blk[2 + j] & 15) - 8) * qb[j] + ((blk[2 + j] >> 4) - 8) * qb[j + 16];
          dw = gguf_load_f16(blk);
        }
        acc = std::fma(static_cast<float>(isum), dw * dx[b], acc);
      }
      y[i * ldy + r] = acc;
    }
  }
}

}  // namespace kestrel::kernels
