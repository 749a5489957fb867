// Int8-activation matrix products: y[T, out] = x[T, in] · Wᵀ with x quantized to int8 per token at
// run time and int32 accumulation inside each weight scale group (format: w4a8_format.h).
//   kW4A8 weights: this path (linear.cpp's matmul forwards here) unless weight-only mode is on.
//   kMxfp4 weights: opt-in fast mode (set_mxfp4_int8(true) or KESTREL_MXFP4_INT8=1); E2M1 values
//   are small integers after ×2, so the weight side stays exact and only x is quantized.
// The ISA path comes from active_isa() (w4a8_isa.h) unless given; AMX machines run the AVX-512 VNNI
// kernels (int8_matmul_amx_tiles below says why). Work is split across OpenMP
// threads in blocks of 16 output rows (64 for the prefill GEMM form).
// On AVX-512 VNNI, from kInt8GemmMinTokens tokens on and with in % 128 == 0, the prefill GEMM form
// runs (w4a8_prefill_avx512.cpp: weights unpacked once per stripe of rows, then multiplied against
// every token); it gives every token the small-T kernel's bits, at any T and any row split.
// Thread-safety: safe to call concurrently (per-thread scratch); not reentrant inside one thread.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/w4a8_format.h"
#include "kernels/cpu/w4a8_isa.h"

namespace kestrel::kernels {

inline constexpr int64_t kInt8GemmMinTokens = 16;
// Which AVX-512 VNNI form runs: kAuto picks the GEMM form from kInt8GemmMinTokens tokens (in % 128 == 0);
// kSmallT / kGemm force one (tests, benchmarks; kGemm requires AVX-512 VNNI and in % 128 == 0).
// Other ISAs ignore it.
enum class Int8Form { kAuto, kSmallT, kGemm };

// y rows have stride ldy (0: w.out); columns [0, w.out) are written.
void int8_matmul(const WeightMatrix& w, const float* x, int64_t T, float* y, int64_t ldy = 0);
void int8_matmul(const WeightMatrix& w, const float* x, int64_t T, float* y, Isa isa, int64_t ldy = 0);
// Rows [r0, r1) of y (stride ldy) on activations already quantized, on the active ISA; serial (the
// caller splits rows across threads: linear.cpp's matmul_many).
void int8_matmul_rows(const WeightMatrix& w, const QuantizedActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1,
                      Int8Form form = Int8Form::kAuto);
// On activations already quantized (tests, benchmarks). Panics on an unsupported ISA.
void int8_matmul_quantized(const WeightMatrix& w, const QuantizedActs& a, float* y, Isa isa, Int8Form form = Int8Form::kAuto);
// The AMX tile kernel (int8_rows_amx: the scalar path's fp32 order), for tests and benchmarks: the dispatcher
// runs the AVX-512 VNNI kernels on AMX machines (w4a8_gemm.cpp, kernel_isa). Panics without AMX.
void int8_matmul_amx_tiles(const WeightMatrix& w, const QuantizedActs& a, float* y);
// Test hook: the same kernel with its tile instructions emulated in C++ (runs on any CPU).
void int8_matmul_amx_emulated(const WeightMatrix& w, const QuantizedActs& a, float* y);

bool mxfp4_int8_enabled();
void set_mxfp4_int8(bool on);
// Weight-only mode for accuracy studies: W4A8 weights decoded to fp32 and multiplied with fp32
// activations (the generic path in linear.cpp), separating weight from activation quantization
// error. set_w4a8_weight_only() or KESTREL_W4A8_WEIGHT_ONLY=1.
bool w4a8_weight_only();
void set_w4a8_weight_only(bool on);

}  // namespace kestrel::kernels
