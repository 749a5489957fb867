// AMX-INT8 path (tdpbusd: unsigned weights × signed activations → int32 tiles).
//
// Tiles (palette 1): tmm0 = C int32 [16 rows × 16 tokens]; tmm1 = A u8 weights [16 rows × 32 k];
// tmm2 = B s8 activations in VNNI layout [8 × (16 tokens · 4 k)]. K steps are 32 elements, so a
// step never straddles a scale group (group ≥ 32). Per 16-row block: the rows are unpacked once
// into u8 (per 32-element step: 16 even elements then 16 odd ones, the order the nibbles come in);
// per 16-token tile the activations are packed once into B with the same element order; then per
// group: tilezero C, tdpbusd over the group's steps, tilestored C, and in fp32
// acc += (C − c·Σ_group x) · scale — the scalar path's exact expression and order.
//
// The tile unit (amx_tiles.h) is a template parameter: HwTiles runs the instructions; EmuTiles executes the same
// sequence in C++ so tests check this kernel's layout on CPUs without AMX.
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/w4a8_kernels.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

constexpr int kStepK = 32;  // elements (bytes of A) per tdpbusd

// C: 16 rows × 16 int32 (tmm0); A: 16 rows × 32 u8 (tmm1); B: 8 rows × 16 tokens × 4 s8 (tmm2).
amx::TileConfig make_config() { return amx::TileConfig().tile(0, 16, 64).tile(1, 16, kStepK).tile(2, kStepK / 4, 64); }

// Position of the j-th byte of a 32-element step in natural element order: 16 even, then 16 odd.
inline int step_element(int j) { return j < 16 ? 2 * j : 2 * (j - 16) + 1; }

struct Scratch {
  std::vector<uint8_t> wu;   // [16, in] unpacked u8 weights
  std::vector<int8_t> b;     // [in/32][8][64] packed activations of one token tile
  std::vector<int32_t> xg;   // [16, groups] per-token group sums
  std::vector<float> scale;  // [16, groups] weight scales in fp32
  alignas(64) int32_t c[16][16];
  float acc[16][16];
};

template <class Tiles>
void amx_rows(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  KCHECK(r1 - r0 <= 16 && t.in % kStepK == 0, "amx_rows: block of at most 16 rows, in % 32 == 0");
  const QuantizedActs& a = *t.acts;
  const bool int4 = t.kind == Int8Weights::kInt4;
  const int64_t in = t.in, G = int4 ? t.group : 32, groups = in / G, steps = in / kStepK;
  const int64_t R = r1 - r0, cmul = int4 ? 8 : 12;
  thread_local Scratch sc;
  sc.wu.assign(static_cast<size_t>(16 * in), 0);
  sc.b.resize(static_cast<size_t>(in * 16));
  sc.xg.resize(static_cast<size_t>(16 * groups));
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* wb = t.packed + (r0 + r) * (in / 2);
    uint8_t* dst = sc.wu.data() + r * in;
    for (int64_t k = 0; k < in; k += kStepK)
      for (int j = 0; j < kStepK; ++j) {
        const int64_t e = k + step_element(j);
        const int code = (wb[e >> 1] >> ((e & 1) * 4)) & 15;
        dst[k + j] = static_cast<uint8_t>(int4 ? code : kMxfp4Twice[code] + 12);
      }
  }
  sc.scale.resize(static_cast<size_t>(R * groups));
  std::vector<float>& scale = sc.scale;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i = (r0 + r) * groups + g;
      if (int4) {
        uint16_t b;
        std::memcpy(&b, t.scales + 2 * i, 2);
        scale[static_cast<size_t>(r * groups + g)] = bf16_to_f32(b);
      } else {
        scale[static_cast<size_t>(r * groups + g)] = 0.5f * e8m0_to_f32(t.scales[i]);
      }
    }
  Tiles::config(make_config());
  for (int64_t n0 = 0; n0 < a.T; n0 += 16) {
    const int64_t N = std::min<int64_t>(16, a.T - n0);
    std::fill(sc.b.begin(), sc.b.end(), 0);
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* x = a.q.data() + (n0 + n) * in;
      for (int64_t s = 0; s < steps; ++s)
        for (int j = 0; j < kStepK; ++j)
          sc.b[static_cast<size_t>(s * 512 + (j / 4) * 64 + n * 4 + j % 4)] = x[s * kStepK + step_element(j)];
      const int32_t* ws = a.wsum.data() + (n0 + n) * (in / 8);
      for (int64_t g = 0; g < groups; ++g) {
        int32_t v = 0;
        for (int64_t w = g * G / 8; w < (g + 1) * G / 8; ++w) v += ws[w];
        sc.xg[static_cast<size_t>(n * groups + g)] = v;
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n) sc.acc[r][n] = 0;
    for (int64_t g = 0; g < groups; ++g) {
      Tiles::template zero<0>();
      for (int64_t s = g * G / kStepK; s < (g + 1) * G / kStepK; ++s) {
        Tiles::template load<1>(sc.wu.data() + s * kStepK, in);
        Tiles::template load<2>(sc.b.data() + s * 512, 64);
        Tiles::template dpbusd<0, 1, 2>();
      }
      Tiles::template store<0>(sc.c, 64);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n) {
          const int32_t v = sc.c[r][n] - static_cast<int32_t>(cmul) * sc.xg[static_cast<size_t>(n * groups + g)];
          sc.acc[r][n] += static_cast<float>(v) * scale[static_cast<size_t>(r * groups + g)];
        }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n) t.y[(n0 + n) * t.ldy + r0 + r] = sc.acc[r][n] * a.scale[static_cast<size_t>(n0 + n)];
  }
  Tiles::release();
}

}  // namespace

__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))
void int8_rows_amx(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  amx_rows<amx::HwTiles>(t, r0, r1);
}

void int8_rows_amx_emulated(const Int8GemmTask& t, int64_t r0, int64_t r1) { amx_rows<amx::EmuTiles>(t, r0, r1); }

}  // namespace kestrel::kernels
