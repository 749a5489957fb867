// GGUF block weights (Q4_0, Q8_0, MXFP4) × int8 activations, the way ggml defines these formats
// to run: the activations are quantized per 32-element block to Q8_0 (ggml's x86 quantize_row_q8_0:
// d = amax/127 stored as fp16, q = round_half_even(x · 127/amax)), and each block contributes
//   float(Σ_j w_j · q_j) · d_w · d_x          (int32 inside the block, exact)
// with w_j the block's small integers (Q4_0: nibble − 8; Q8_0: int8; MXFP4: 2·E2M1) and d_w its
// scale (fp16; MXFP4: 2^(e−128)). Q4_0 and MXFP4 matrices loaded from a file run on a copy of their rows
// repacked in groups of 16 (WeightMatrix::packed, gguf_q4_x16.h: one kernel at every T), which
// gguf_int8_product / _at route to; Q8_0 weights, and MXFP4 matrices without packed rows, are used in
// place (linear_gguf.h layouts) by the small-T and GEMM kernels declared here.
// This is the default for GGUF quantized weights (what llama.cpp computes on the same file);
// set_gguf_int8(false) or KESTREL_GGUF_INT8=0 selects the exact path (rows decoded to fp32, fp32
// activations), which the exactness goldens use.
// Paths: AVX-512 VNNI (vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd; the same bits per token) and a scalar
// reference; on CPUs with neither the int8 mode is off (the fp32 path runs), since the scalar kernel is
// only a test reference.
#pragma once

#include <cstdint>
#include <vector>

#include "base/aligned_vector.h"
#include "kernels/cpu/linear.h"

namespace kestrel::kernels {

// Q8_0 activations of T tokens, laid out for the kernels. nb = in/32 blocks, nc = ceil(nb/4)
// chunks of 128 elements; every row is padded to nc·128 with zero blocks (zero scale).
//   q    [T, nc·128]  natural order (Q8_0 weights);
//   qg   [T, nc·128]  per chunk: the first 16 elements of each of its 4 blocks, then the last 16 of
//                     each (lines up with MXFP4 bytes: low nibbles = elements 0..15);
//   comp [T, nc·16]   int32 lane i of chunk c: Σ q over block 4c + i/4 when i % 4 == 0, else 0
//                     (the u8-offset compensation, multiplied by −12 for MXFP4);
//   d    [T, nc·4]    fp32 value of each block's fp16 scale (0 for padding).
// With gemm_q4 / gemm_mx / gemm_q8, derived once per token:
//   n4      [T, nc·16]  lane 4k+i of chunk c: −8·comp (the packed kernels' block compensation,
//                       gguf_q4_x16.h, Q4_0 and MXFP4 alike; gemm_q4);
//   dx4     [T, nc·16]  lane 4k+i of chunk c: d of block 4c + k (MXFP4 lanes, with n12; gemm_mx);
//   n12     [T, nc·16]  −12·comp (MXFP4 lanes; with dx4): the in-place MXFP4 GEMM form's input, and the
//                       VBMI small-T loader's when present;
//   n8, dx8 [T, nc·32]  half h, lane l: −128·Σ of q over elements 64h + 4l .. +3 of the chunk, and
//                       d of block 4c + 2h + l/8 (Q8_0 lanes, the GEMM form's input).
// Buffers only grow (steady-state decode allocates nothing) and start on a cache line, so the
// per-token rows of q, qg, comp, n4/dx4 and n8/dx8 (multiples of 64 bytes) are line-aligned zmm loads. Requires in % 32 == 0.
struct Q8Acts {
  int64_t T = 0, in = 0, nb = 0, nc = 0;
  bool gemm_q4 = false, gemm_q8 = false, gemm_mx = false;
  AlignedVector<int8_t> q, qg;
  AlignedVector<int32_t> comp, n4, n8, n12;
  AlignedVector<float> d, dx4, dx8;
};

void quantize_q8_0_acts(const float* x, int64_t T, int64_t in, Q8Acts& out);
// The same in two steps, so tokens can be quantized in parallel: prepare sizes the buffers (serial),
// fill quantizes tokens [t0, t1) of x [T, in] (disjoint ranges may run concurrently).
void q8_acts_prepare(Q8Acts& a, int64_t T, int64_t in, bool gemm_q4 = false, bool gemm_q8 = false, bool gemm_mx = false);
void q8_acts_fill(const float* x, int64_t t0, int64_t t1, Q8Acts& a);
// Chunks [c0, c1) (128 elements each) of token t, x_row = its whole input row: a block's quantization
// reads only its own 32 elements, so threads that produce different 128-aligned stripes of one row can
// each quantize their stripe (the same bits as q8_acts_fill of the whole row).
void q8_acts_fill_chunks(const float* x_row, int64_t t, int64_t c0, int64_t c1, Q8Acts& a);

// Formats this path handles.
bool is_gguf_int8_format(WeightFormat f);
// Whether matmul uses this path for `w` (format handled, Q4_0 with its packed rows, mode on, AVX-512 VNNI
// or AVX2 + FMA + F16C active).
bool gguf_int8_applies(const WeightMatrix& w);
// Whether w's int8 products run on the packed kernels (gguf_q4_x16.h): Q4_0 always (without packed rows
// it has no int8 path), MXFP4 when it has packed rows (w.packed; GgufWeights packs every matrix it loads).
bool gguf_int8_runs_packed(const WeightMatrix& w);
bool gguf_int8_enabled();
void set_gguf_int8(bool on);

// The small-T kernel for Q8_0 and MXFP4, read in place from the ggml rows (Q4_0 is refused: it runs on
// its packed rows, gguf_q4_x16.h, as packed MXFP4 does in gguf_int8_product): y[t, r] for r in [r0, r1),
// every token of `a` (y row stride ldy). Serial; callers
// split rows. With in % 128 == 0 on a CPU with AVX-512 VBMI it takes a faster chunk loader (byte
// permutes instead of per-block inserts; same arithmetic, same bits); vbmi = false forces the generic
// AVX-512 loader (tests run both).
void gguf_int8_rows_avx512(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1,
                           bool vbmi = true);
bool gguf_int8_vbmi_applies(const WeightMatrix& w);
// The same kernel for n tokens picked from `a`: y[i·ldy + r] for activation token tok[i] (i < n), with the
// bits gguf_int8_rows_avx512 gives that token (per (row, token) the same operations in the same order).
// Routed MoE experts read their tokens from one quantization of the layer input this way.
void gguf_int8_rows_at(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy, int64_t r0,
                       int64_t r1, bool vbmi = true);
// Prefill (convert-then-GEMM) form for Q8_0 / MXFP4 (Q4_0 refused), gguf_int8_gemm_avx512.cpp: the same
// bits as gguf_int8_rows_avx512 for every token (same lane integers, products and fma order); needs `a`
// prepared with gemm_q8 (Q8_0) / gemm_mx (MXFP4). matmul takes it from
// gguf_int8_gemm_min_tokens(format) tokens; the _at form (tokens picked by index, as gguf_int8_rows_at) serves the
// routed MoE experts that receive that many tokens.
bool gguf_int8_gemm_format(WeightFormat f);
// Whether `a` carries the GEMM layout w's format needs.
bool gguf_int8_gemm_prepared(const WeightMatrix& w, const Q8Acts& a);
void gguf_int8_gemm_rows(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gguf_int8_gemm_rows_at(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1);
inline constexpr int64_t kGgufGemmMinTokens = 16;
// The small-T kernel in AVX2 (with FMA and F16C) for CPUs without AVX-512 VNNI, gguf_int8_avx2.cpp: the
// same lanes, integers and float operations in the same order, so each token gets the bits
// gguf_int8_rows_avx512 gives it.
void gguf_int8_rows_avx2(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gguf_int8_rows_at_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1);
// The prefill form in AVX2 (with FMA and F16C), gguf_int8_gemm_avx2.cpp: the same unpack-once structure
// and inputs as gguf_int8_gemm_rows, with each token's bits those of gguf_int8_rows_avx2 (hence of the
// AVX-512 kernels). matmul takes it on CPUs without AVX-512 VNNI from kGgufGemmMinTokensAvx2 tokens.
void gguf_int8_gemm_rows_avx2(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gguf_int8_gemm_rows_at_avx2(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                                 int64_t r0, int64_t r1);
inline constexpr int64_t kGgufGemmMinTokensAvx2 = 16;
// Whether a product over T tokens takes the GEMM form: for its formats, from gguf_int8_gemm_min_tokens(f).
bool gguf_int8_gemm_applies(WeightFormat f, int64_t T);
// The token count from which the active ISA takes the GEMM form for Q8_0 / MXFP4: kGgufGemmMinTokensAvx2
// where the AVX2 kernels run; kGgufGemmMinTokens on AVX-512 VNNI, except on CPUs that run 512-bit ops as
// two halves (AMD Zen 4), where the MXFP4 small-T kernel stays as fast up to 32 tokens: MXFP4 from 64,
// Q8_0 from kGgufGemmMinTokens. The bits are the same either way.
int64_t gguf_int8_gemm_min_tokens(WeightFormat f);
// Whether an input of T tokens to a product on w wants the layout w's kernel reads (gguf_int8_layout:
// Q8Acts::gemm_q4 for the packed kernels, else gemm_q8 / gemm_mx by format): the packed kernels always
// read it (n4), the GEMM form needs it, and the AVX-512 VBMI small-T kernel reads the token side of
// in-place MXFP4 chunks from it (the same lane values, loaded instead of derived per block call: the same
// bits; one core of a Zen 4, 2048 × 2048 at T = 16: MXFP4 1.08 → 0.88 ms).
bool gguf_int8_layout_wanted(const WeightMatrix& w, int64_t T);
// Which of the layouts an input of T tokens to a product on w wants (all false where none is).
struct Q8Layouts {
  bool q4 = false, q8 = false, mx = false;  // Q8Acts::gemm_q4 / gemm_q8 / gemm_mx
};
Q8Layouts gguf_int8_layout(const WeightMatrix& w, int64_t T);
// The product the active ISA runs for every token of `a` (or n tokens picked by index): Q4_0 and packed
// MXFP4 on the packed rows (gguf_q4_x16.h, one kernel at every T: each token's bits are the lane model's
// whatever the batch); Q8_0 / in-place MXFP4 on the GEMM form where gguf_int8_gemm_applies, else the
// small-T kernel (AVX-512 or AVX2). The same bits any way.
void gguf_int8_product(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gguf_int8_product_at(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                          int64_t r0, int64_t r1);
// Scalar reference for Q8_0 / MXFP4 in place (Q4_0's and packed MXFP4's is q4_x16_rows_model): the same
// integer block sums, blocks summed in order in fp32.
void gguf_int8_rows_scalar(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);

}  // namespace kestrel::kernels
