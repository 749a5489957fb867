// Element types of checkpoint tensors and their scalar conversions to fp32.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kestrel {

enum class DType { kF32, kF16, kBF16, kU8, kI8, kI32, kI64, kF8E4M3, kF64, kBool };

// Bytes per element.
int64_t dtype_size(DType t);
// Name as written in safetensors headers ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round-to-nearest-even, NaN kept quiet.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// IEEE binary16, round to nearest even (what F16C's vcvtps2ph with imm 0 does): overflow → inf,
// NaN stays NaN (quiet), tiny values → subnormals / ±0.
inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // ≥ 65520 rounds to inf
  if (a < 0x38800000u) {  // below 2^-14: subnormal half (or zero); value = a_real / 2^-24
    const float v = std::bit_cast<float>(a) * 16777216.0f;  // exact scaling by 2^24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(v)));
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 → 15 (in the fp32 bit position)
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// OCP FP8 E4M3 (fn variant: no infinities, 0x7f/0xff are NaN).
inline float f8e4m3_to_f32(uint8_t b) {
  const bool neg = b & 0x80;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) return NAN;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -9);
  else v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return neg ? -v : v;
}

// MXFP4: E2M1 magnitudes indexed by the low 3 bits of a code; bit 3 is the sign.
inline constexpr float kE2M1Values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// E8M0 block scale 2^(s-127); s == 255 is NaN.
inline float e8m0_to_f32(uint8_t s) {
  if (s == 255) return NAN;
  if (s == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 (subnormal)
  return std::bit_cast<float>(static_cast<uint32_t>(s) << 23);
}

}  // namespace kestrel
