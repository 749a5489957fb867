// GGUF Q4_0 and MXFP4 weights repacked in groups of 16 rows (row interleave), for the int8 products of
// gguf_int8.h. Both are 32-element blocks of 16 code bytes (element j < 16 the low nibble of byte j,
// element j + 16 its high nibble) and one scale, so they share the layout and the kernels.
// The lane model: one int32 lane per weight row, each lane holding whole-block integer sums, so the
// float work (conversion, scale product, FMA) is one op per 16 rows and block instead of one per row and
// 4 elements. For row r and token t, with isum_b = Σ_j w_j · q_j over block b (exact, int32) and w_j the
// block's small integers (Q4_0: nibble − 8; MXFP4: kGgufE2M1Doubled[nibble], 2·E2M1 ∈ [−12, 12]):
//   y = 0;  for b = 0 .. nb−1:  y = fma(float(isum_b), d_w[r, b] · d_x[t, b], y)
// (the scale product rounded to fp32, one fused multiply-add per block, blocks in order), with d_w the
// block's fp16 scale (Q4_0) or 2^(e−128) (MXFP4, gguf_e8m0_half). Every packed int8 path (AVX-512 VNNI,
// AVX2, any T, any row range, tokens picked by index) computes exactly this, so each token's bits depend
// on nothing else (batch invariance); the AMX tile form too (its block sums are exact). q4_x16_rows_model
// is the same in plain C++, read from the ggml rows, not from the packed copy.
//
// Packed layout: group g = rows 16g .. 16g+15 (rows past `out` are zero: zero codes, zero scale bytes; an
// MXFP4 zero code is the value 0, so such a row sums to 0 either way); per group, the nb = in/32 blocks in
// order, each 288 bytes:
//   [0, 32)    the scales. Q4_0: the 16 rows' fp16 d_w, row i at 2i. MXFP4: the 16 rows' E8M0 bytes e,
//              row i at i, then 16 zero bytes;
//   [32, 288)  4 units of 64 bytes; unit u holds bytes 4u .. 4u+3 of each row's 16 code bytes, row i at
//              32 + 64u + 4i. Low nibbles are elements 4u .. 4u+3 of the block, high nibbles 16+4u .. 16+4u+3.
// So one 64-byte load gives 16 rows × 4 code bytes, the `vpdpbusd` operand against 4 broadcast activation
// bytes (the same idea as ik_llama.cpp's and llama.cpp's interleaved-row Q4_0 repacks; this layout is
// Kestrel's own). Groups follow each other (group stride nb · 288): a group's bytes are contiguous.
// The kernels use the codes as unsigned bytes u = w + o (Q4_0: the nibble itself, o = 8; MXFP4: a byte
// shuffle to 2·E2M1 + 12 ∈ [0, 24], o = 12) and start each block's sum at −o·Σq: the same exact integer.
#pragma once

#include <cstdint>

#include "base/aligned_vector.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/linear.h"

namespace kestrel::kernels {

inline constexpr int64_t kQ4x16Rows = 16;
inline constexpr int64_t kQ4x16BlockBytes = 288;

// The formats with this packed form (GGUF Q4_0 and MXFP4).
inline bool x16_format(WeightFormat f) { return f == WeightFormat::kGgufQ4_0 || f == WeightFormat::kGgufMxfp4; }

// Bytes of the packed copy of an [out, in] Q4_0 or MXFP4 matrix (in % 32 == 0).
int64_t q4_x16_bytes(int64_t out, int64_t in);
// Packs w (kGgufQ4_0, w.data = ggml rows) into dst (q4_x16_bytes(w.out, w.in) bytes, 64-byte aligned).
void pack_q4_0_x16(const WeightMatrix& w, uint8_t* dst);
// The same into a new buffer; the caller keeps it alive and points w.packed at it.
AlignedVector<uint8_t> pack_q4_0_x16(const WeightMatrix& w);
// The same for kGgufMxfp4 (w.data = ggml rows of 17-byte blocks).
void pack_mxfp4_x16(const WeightMatrix& w, uint8_t* dst);
AlignedVector<uint8_t> pack_mxfp4_x16(const WeightMatrix& w);

// Rows [r0, r0 + n) of a Q4_0 or MXFP4 matrix w in place (r0 a multiple of 16 when w has packed rows):
// data and packed both start at row r0.
WeightMatrix x16_row_view(const WeightMatrix& w, int64_t r0, int64_t n);

// What the packed kernels read of activation token t: its codes (natural order), −8·Σq per block (at
// 4·b of n4; MXFP4 derives −12·Σq = (n4 / 2) · 3 from it) and the fp32 block scales.
struct Q4x16Token {
  const int8_t* q;
  const int32_t* n4;
  const float* d;
};
inline Q4x16Token q4_x16_token(const Q8Acts& a, int64_t t) {
  const int64_t P = a.nc * 128;
  return {a.q.data() + t * P, a.n4.data() + t * (P / 8), a.d.data() + t * (P / 32)};
}

// y[i·ldy + r] for r in [r0, r1) and n tokens: activation token tok[i], or i itself when tok is null.
// w: Q4_0 or MXFP4 with its packed rows. `a` needs its Q4_0 layout (Q8Acts::gemm_q4: the −8·Σq of each
// block), whichever the format. Serial; callers split rows (any split: a partial group is computed whole
// and stored masked, the bits do not depend on it).
void q4_x16_rows_avx512(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                        int64_t r0, int64_t r1);
void q4_x16_rows_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                      int64_t r0, int64_t r1);
// The AMX-INT8 form (gguf_q4_x16_amx.cpp): the same bits from the tile unit, for many tokens (callers check
// isa_supported(Isa::kAmx) and take it from kQ4x16AmxMinTokens tokens). The _emulated twin runs the same
// tile sequence in C++ (tests; needs AVX-512 VNNI for its float step).
inline constexpr int64_t kQ4x16AmxMinTokens = 16;
void q4_x16_rows_amx(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                     int64_t r0, int64_t r1);
void q4_x16_rows_amx_emulated(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y,
                              int64_t ldy, int64_t r0, int64_t r1);
// The lane model in scalar C++ from w.data (the ggml rows; tests compare the kernels with it bit for bit).
void q4_x16_rows_model(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1);

}  // namespace kestrel::kernels
