// AMX-INT8 form of the packed Q4_0 / MXFP4 kernel (gguf_q4_x16.h), for many tokens: the lane model's bits
// from the tile unit. The lane model needs, per (row, token, block), the exact int32 block sum
// isum = Σ_j w_j · q_j, then fma(float(isum), d_w · d_x, acc) in block order. One `tdpbssd` with K = 32
// (one block) gives those sums for 16 tokens × 16 rows at once:
//   A (tmm2/3): 16 tokens × the block's 32 activation bytes, from the pass's copy of the tokens' rows (tokens
//               picked by index are gathered there; zero rows pad the last tile);
//   B (tmm4/5): the block's 16 rows as signed bytes in the tile unit's 4-byte-group layout, which is
//               exactly the packed layout's units split into nibbles: B row u = the low nibbles of unit u,
//               row 4 + u its high nibbles (Q4_0: nibble − 8; MXFP4: 2·E2M1 from a byte shuffle);
//   C (tmm0/1/6/7): C[token][row] = isum.
// Each C row is then one zmm (16 rows of one token), and the float step is the AVX-512 kernel's own:
// convert, d_w · d_x, FMA. Sums are exact and the float ops are the same ops in the same order, so every
// token gets the lane model's bits at any T and any row split (tested against q4_x16_rows_model).
// A row group's B tiles are unpacked once per pass of up to kPass tokens. Per 16-token tile the blocks are
// software-pipelined: block b + 2's product is issued, block b's C stored, and block b − 1's C (stored a
// turn earlier) converted, so the tile unit, the tile stores and the vector unit overlap; the C register
// rotates over four tiles so no tile is rewritten while its store is in flight. The per-block float step
// bounds this form: 16 conversions, products and FMAs per 16 × 16 × 32 tile product.
// The tile unit is a template parameter (amx_tiles.h): on CPUs without AMX the tests run this sequence
// through the emulated unit.
// GCC 12 false positive in its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/aligned_vector.h"
#include "base/check.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/gguf_q4_x16_avx512_scales.h"
#include "kernels/cpu/linear_gguf.h"

#define KESTREL_AMX_X16 \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma,f16c")))

namespace kestrel::kernels {
namespace {

// Tokens per pass: their activation rows (kPass · in bytes) stay in L2 while each row group's B tiles
// (16 · in bytes) are reused from L1/L2 by the pass's token tiles.
constexpr int64_t kPass = 128;
constexpr int64_t kBBytes = 512;  // one block's B tile: 8 rows × 64 bytes

// C: 16 tokens × 16 int32 rows (tmm0, tmm1, tmm6, tmm7); A: 16 tokens × 32 s8 (tmm2, tmm3); B: 8 × 64 s8
// (tmm4, tmm5).
amx::TileConfig tile_config() {
  amx::TileConfig c;
  for (int r : {0, 1, 6, 7}) c.tile(r, 16, 64);
  for (int r : {2, 3}) c.tile(r, 16, 32);
  for (int r : {4, 5}) c.tile(r, 8, 64);
  return c;
}

// Nibbles 0..15 as signed weight bytes: Q4_0 nibble − 8, MXFP4 2·E2M1.
template <WeightFormat F>
KESTREL_AMX_X16 inline __m512i signed_codes(__m512i nibbles) {
  if constexpr (F == WeightFormat::kGgufQ4_0) {
    return _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8));
  } else {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kGgufE2M1Doubled))),
                               nibbles);
  }
}

// The B tiles of one row group (nb packed blocks at g) into dst (nb · 512 bytes), and its d_w into dw
// (nb · 16 floats).
template <WeightFormat F>
KESTREL_AMX_X16 void unpack_group(const uint8_t* g, int64_t nb, int8_t* dst, float* dw) {
  const __m512i nib = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < nb; ++b) {
    _mm512_store_ps(dw + b * 16, x16::row_scales<F>(g + b * kQ4x16BlockBytes));
    const uint8_t* p = g + b * kQ4x16BlockBytes + 32;
    int8_t* d = dst + b * kBBytes;
    for (int u = 0; u < 4; ++u) {
      const __m512i raw = _mm512_loadu_si512(p + 64 * u);  // 32-byte aligned
      _mm512_store_si512(d + 64 * u, signed_codes<F>(_mm512_and_si512(raw, nib)));
      _mm512_store_si512(d + 64 * (4 + u), signed_codes<F>(_mm512_and_si512(_mm512_srli_epi16(raw, 4), nib)));
    }
  }
}

struct Scratch {
  AlignedVector<int8_t> x;  // [tiles · 16, in] the pass's activation rows, zero rows after the last token
  AlignedVector<int8_t> b;  // [nb, 512] one row group's B tiles
  AlignedVector<float> dw;  // [nb, 16] one row group's d_w
  AlignedVector<float> d;   // [tiles, nb, 16] the pass's d_x, per token tile and block its 16 tokens in a row
  alignas(64) int32_t c[2][16][16];  // two blocks' C tiles: one being stored while the other is read
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Tile registers by block b: C in tmm0 / tmm1 / tmm6 / tmm7 (b mod 4), A in tmm2 / tmm3 and B in tmm4 / tmm5
// (b mod 2). Tile registers are not renamed: a tile cannot be rewritten before the store (or product) that
// reads it has finished, so each block's C is written in a register whose last store is two turns old.
template <int P>
constexpr int kCReg = P == 0 ? 0 : P == 1 ? 1 : P == 2 ? 6 : 7;

// What one 16-token tile reads: its activation rows (stride in), d_x per block (16 tokens in a row), the
// row group's d_w and B tiles, and the two C buffers. Plain pointers in registers: the
// tile instructions' "memory" clobbers would make the compiler reload anything it reads through Scratch.
struct TileArgs {
  const int8_t* x;
  int64_t in;
  const float* d;
  const float* dw;
  const int8_t* bt;
  int32_t (*c)[16][16];
  int64_t nb;
};

// C = A · B for block b (phase P = b mod 4).
template <class Tiles, int P>
KESTREL_AMX_X16 inline void issue(const TileArgs& t, int64_t b) {
  Tiles::template zero<kCReg<P>>();
  Tiles::template load<2 + (P & 1)>(t.x + b * 32, t.in);
  Tiles::template load<4 + (P & 1)>(t.bt + b * kBBytes, 64);
  Tiles::template dpbssd<kCReg<P>, 2 + (P & 1), 4 + (P & 1)>();
}

// acc[m] = fma(float(C[m]), d_w · d_x[m], acc[m]) for the tile's 16 tokens, block b (C in c).
KESTREL_AMX_X16 inline void accumulate(const TileArgs& t, const int32_t (*c)[16], int64_t b, __m512* acc) {
  const __m512 dw = _mm512_load_ps(t.dw + b * 16);
  const float* dx = t.d + b * 16;
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m)
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[m])), _mm512_mul_ps(dw, _mm512_set1_ps(dx[m])), acc[m]);
}

// Block b's turn (phase P = b mod 4): start block b + 2 on the tile unit, store block b's C (its product was
// started two turns ago: the product's latency is long), and take block b − 1's (stored one turn ago, so its
// store has landed) into the accumulators.
template <class Tiles, WeightFormat F, int P>
KESTREL_AMX_X16 inline void turn(const TileArgs& t, int64_t b, __m512* acc) {
  if (b + 2 < t.nb) issue<Tiles, (P + 2) % 4>(t, b + 2);
  Tiles::template store<kCReg<P>>(t.c[b & 1], 64);
  if (b >= 1) accumulate(t, t.c[(b - 1) & 1], b - 1, acc);
}

// One row group against one 16-token tile.
template <class Tiles, WeightFormat F>
KESTREL_AMX_X16 void tile(const TileArgs t, float* y, int64_t ldy, int64_t ntok, __mmask16 mask) {
  __m512 acc[16];
  for (auto& v : acc) v = _mm512_setzero_ps();
  const int64_t nb = t.nb;
  issue<Tiles, 0>(t, 0);
  if (nb > 1) issue<Tiles, 1>(t, 1);
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    turn<Tiles, F, 0>(t, b, acc);
    turn<Tiles, F, 1>(t, b + 1, acc);
    turn<Tiles, F, 2>(t, b + 2, acc);
    turn<Tiles, F, 3>(t, b + 3, acc);
  }
  if (b < nb) turn<Tiles, F, 0>(t, b, acc);
  if (b + 1 < nb) turn<Tiles, F, 1>(t, b + 1, acc);
  if (b + 2 < nb) turn<Tiles, F, 2>(t, b + 2, acc);
  accumulate(t, t.c[(nb - 1) & 1], nb - 1, acc);
  for (int64_t m = 0; m < ntok; ++m) _mm512_mask_storeu_ps(y + m * ldy, mask, acc[m]);
}

template <class Tiles, WeightFormat F>
KESTREL_AMX_X16 void rows(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                          int64_t r0, int64_t r1) {
  const int64_t nb = a.nb, in = nb * 32, P = a.nc * 128, gbytes = nb * kQ4x16BlockBytes;
  Scratch& sc = scratch();
  if (static_cast<int64_t>(sc.x.size()) < kPass * in) sc.x.resize(static_cast<size_t>(kPass * in));
  if (static_cast<int64_t>(sc.b.size()) < nb * kBBytes) sc.b.resize(static_cast<size_t>(nb * kBBytes));
  if (static_cast<int64_t>(sc.dw.size()) < nb * 16) sc.dw.resize(static_cast<size_t>(nb * 16));
  if (static_cast<int64_t>(sc.d.size()) < kPass * nb) sc.d.resize(static_cast<size_t>(kPass * nb));
  Tiles::config(tile_config());
  for (int64_t p0 = 0; p0 < n; p0 += kPass) {
    const int64_t pn = std::min(kPass, n - p0), rows16 = (pn + 15) / 16 * 16;
    for (int64_t i = 0; i < rows16; ++i) {  // the pass's tokens, then zero rows to a whole tile
      int8_t* dst = sc.x.data() + i * in;
      float* dt = sc.d.data() + (i / 16) * nb * 16 + i % 16;
      if (i < pn) {
        const int64_t t = tok ? tok[p0 + i] : p0 + i;
        std::memcpy(dst, a.q.data() + t * P, static_cast<size_t>(in));
        const float* dx = a.d.data() + t * (P / 32);
        for (int64_t b = 0; b < nb; ++b) dt[b * 16] = dx[b];
      } else {
        std::memset(dst, 0, static_cast<size_t>(in));
        for (int64_t b = 0; b < nb; ++b) dt[b * 16] = 0;  // computed, never stored
      }
    }
    for (int64_t g = r0 / kQ4x16Rows; g * kQ4x16Rows < r1; ++g) {
      const int64_t lo = std::max(r0, g * kQ4x16Rows), hi = std::min(r1, (g + 1) * kQ4x16Rows);
      const auto mask = static_cast<__mmask16>(((1u << (hi - lo)) - 1u) << (lo - g * kQ4x16Rows));
      const uint8_t* gp = w.packed + g * gbytes;
      unpack_group<F>(gp, nb, sc.b.data(), sc.dw.data());
      for (int64_t t0 = 0; t0 < pn; t0 += 16) {
        const TileArgs t{sc.x.data() + t0 * in, in, sc.d.data() + t0 * nb, sc.dw.data(), sc.b.data(), sc.c, nb};
        tile<Tiles, F>(t, y + (p0 + t0) * ldy + g * kQ4x16Rows, ldy, std::min<int64_t>(16, pn - t0), mask);
      }
    }
  }
  Tiles::release();
}

template <class Tiles>
KESTREL_AMX_X16 void run(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                         int64_t r0, int64_t r1, const char* name) {
  KCHECK(x16_format(w.format) && w.packed != nullptr && w.in == a.in && a.gemm_q4,
         std::string(name) + ": needs packed Q4_0 or MXFP4 weights and activations with their Q4_0 layout");
  KCHECK(r0 >= 0 && r1 <= w.out, std::string(name) + ": rows out of range");
  if (tok != nullptr)
    for (int64_t i = 0; i < n; ++i) KCHECK(tok[i] >= 0 && tok[i] < a.T, std::string(name) + ": token index out of range");
  if (r0 >= r1 || n <= 0) return;
  if (w.format == WeightFormat::kGgufMxfp4) return rows<Tiles, WeightFormat::kGgufMxfp4>(w, a, tok, n, y, ldy, r0, r1);
  rows<Tiles, WeightFormat::kGgufQ4_0>(w, a, tok, n, y, ldy, r0, r1);
}

}  // namespace

void q4_x16_rows_amx(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                     int64_t r0, int64_t r1) {
  run<amx::HwTiles>(w, a, tok, n, y, ldy, r0, r1, "q4_x16_rows_amx");
}

void q4_x16_rows_amx_emulated(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y,
                              int64_t ldy, int64_t r0, int64_t r1) {
  run<amx::EmuTiles>(w, a, tok, n, y, ldy, r0, r1, "q4_x16_rows_amx_emulated");
}

}  // namespace kestrel::kernels
