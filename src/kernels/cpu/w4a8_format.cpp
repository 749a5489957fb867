#include "kernels/cpu/w4a8_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {

void quantize_int4_row(const float* w, int64_t in, int64_t group, uint32_t* packed, uint16_t* scales) {
  KCHECK(group > 0 && group % 8 == 0 && in % group == 0, "quantize_int4_row: bad group");
  std::memset(packed, 0, static_cast<size_t>(in / 8) * sizeof(uint32_t));
  for (int64_t g = 0; g < in / group; ++g) {
    const float* v = w + g * group;
    float amax = 0;
    for (int64_t k = 0; k < group; ++k) amax = std::max(amax, std::fabs(v[k]));
    uint16_t s = f32_to_bf16(amax / 7.5f);
    if (bf16_to_f32(s) == 0.0f) s = f32_to_bf16(0.0078125f);  // compressed-tensors: bf16 eps
    scales[g] = s;
    const float sf = bf16_to_f32(s);
    for (int64_t k = 0; k < group; ++k) {
      const float quot = bf16_to_f32(f32_to_bf16(v[k] / sf));
      const int q = static_cast<int>(std::clamp(std::nearbyint(quot), -8.0f, 7.0f));
      const int64_t e = g * group + k;
      packed[e / 8] |= static_cast<uint32_t>(q + 8) << (4 * (e % 8));
    }
  }
}

void dequantize_int4_row(const uint8_t* row_bytes, const uint16_t* scales, int64_t in, int64_t group, float* dst) {
  for (int64_t g = 0; g < in / group; ++g) {
    const float s = bf16_to_f32(scales[g]);
    for (int64_t k = g * group; k < (g + 1) * group; ++k) dst[k] = static_cast<float>(int4_at(row_bytes, k)) * s;
  }
}

int64_t simd_order_index(int64_t k, int64_t in) {
  const int64_t full = in / 128 * 128;
  const int64_t chunk = k < full ? 128 : 32;
  const int64_t base = k < full ? k / 128 * 128 : full + (k - full) / 32 * 32;
  const int64_t j = k - base;
  return base + (j & 1) * (chunk / 2) + j / 2;
}

void quantize_activations(const float* x, int64_t T, int64_t in, QuantizedActs& a) {
  KCHECK(in % 32 == 0, "quantize_activations: in must be a multiple of 32");
  a.T = T, a.in = in;
  const size_t n = static_cast<size_t>(T * in);
  if (a.q.size() < n) a.q.resize(n), a.qp.resize(n);
  if (a.wsum.size() < n / 8) a.wsum.resize(n / 8);
  if (a.scale.size() < static_cast<size_t>(T)) a.scale.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * in;
    int8_t* q = a.q.data() + t * in;
    float amax = 0;
    for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(xr[k]));
    a.scale[static_cast<size_t>(t)] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t k = 0; k < in; ++k) q[k] = static_cast<int8_t>(std::clamp(std::nearbyint(xr[k] * inv), -127.0f, 127.0f));
    // SIMD order (see simd_order_index): evens then odds per 128-element chunk, then per 32.
    int8_t* qp = a.qp.data() + t * in;
    const int64_t full = in / 128 * 128;
    for (int64_t c = 0; c < full; c += 128)
      for (int64_t j = 0; j < 64; ++j) qp[c + j] = q[c + 2 * j], qp[c + 64 + j] = q[c + 2 * j + 1];
    for (int64_t c = full; c < in; c += 32)
      for (int64_t j = 0; j < 16; ++j) qp[c + j] = q[c + 2 * j], qp[c + 16 + j] = q[c + 2 * j + 1];
    int32_t* ws = a.wsum.data() + t * (in / 8);
    for (int64_t w = 0; w < in / 8; ++w) {
      int32_t s = 0;
      for (int64_t k = 0; k < 8; ++k) s += q[w * 8 + k];
      ws[w] = s;
    }
  }
}

}  // namespace kestrel::kernels
