#include "kernels/cpu/fp8_e4m3.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "tensor/dtype.h"

namespace kestrel::kernels {

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (std::isnan(x)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;  // saturate (act_quant clamps before the cast anyway)
  if (a < 0.015625f) {                  // below 2^-6: subnormal grid of 2^-9 (8 → the first normal)
    const int m = static_cast<int>(std::nearbyint(a * 512.0f));  // default rounding mode: to nearest even
    return sign | static_cast<uint8_t>(m);
  }
  // Normal: round the fp32 mantissa to 3 bits, nearest-even; a carry bumps the exponent.
  uint32_t u = std::bit_cast<uint32_t>(a);
  u += 0x7ffffu + ((u >> 20) & 1u);
  const int e = static_cast<int>(u >> 23) - 127 + 7;
  const int m = static_cast<int>((u >> 20) & 7u);
  if (e > 15 || (e == 15 && m == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((e << 3) | m);
}

const float* e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) v[static_cast<size_t>(i)] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return v;
  }();
  return t.data();
}

float quantize_e4m3_block(const float* x, int64_t n, bool ue8m0, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  amax = std::max(amax, 1e-4f);
  float s = amax * (1.0f / 448.0f);  // the reference multiplies by fp8_max_inv
  if (ue8m0) {
    // fast_round_scale: 2^(exponent + (mantissa != 0)), from the fp32 bits of amax / 448.
    const uint32_t b = std::bit_cast<uint32_t>(s);
    const int e = static_cast<int>((b >> 23) & 0xff) - 127 + ((b & 0x7fffffu) != 0 ? 1 : 0);
    s = std::ldexp(1.0f, e);
  }
  for (int64_t i = 0; i < n; ++i) codes[i] = f32_to_e4m3(std::clamp(x[i] / s, -448.0f, 448.0f));
  return s;
}

void decode_e4m3(const uint8_t* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = in[i];
    const uint32_t sign = (b & 0x80u) << 24;
    const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
    const uint32_t normal = sign | ((e + 120u) << 23) | (m << 20);
    // Subnormal m·2^-9 = (1.m' …) built by the FPU: float(m) · 2^-9, sign OR-ed in.
    const uint32_t sub = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(m)) * 0x1p-9f) | sign;
    const uint32_t keep_normal = 0u - static_cast<uint32_t>(e != 0);  // all ones when normal
    out[i] = std::bit_cast<float>((normal & keep_normal) | (sub & ~keep_normal));
  }
}

}  // namespace kestrel::kernels
