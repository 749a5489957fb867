#include "kernels/cpu/w4a8_gemm.h"

#include <algorithm>

#include "base/check.h"
#include "base/env_switch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/w4a8_kernels.h"

namespace kestrel::kernels {
namespace {

constexpr int64_t kRowBlock = 16;  // rows per work item (the AMX tile height)

using RowsFn = void (*)(const Int8GemmTask&, int64_t, int64_t);

Int8GemmTask make_task(const WeightMatrix& w, const QuantizedActs& a, float* y, int64_t ldy = 0) {
  KCHECK(w.format == WeightFormat::kW4A8 || w.format == WeightFormat::kMxfp4, "int8_matmul: W4A8 or MXFP4 weights only");
  KCHECK(w.in == a.in && w.in % 32 == 0 && w.scales != nullptr, "int8_matmul: shape mismatch");
  Int8GemmTask t;
  t.kind = w.format == WeightFormat::kW4A8 ? Int8Weights::kInt4 : Int8Weights::kMxfp4;
  t.packed = static_cast<const uint8_t*>(w.data);
  t.scales = w.scales;
  t.out = w.out, t.in = w.in;
  t.group = t.kind == Int8Weights::kInt4 ? w.group : 32;
  KCHECK(t.group == 32 || t.group == 64 || t.group == 128, "int8_matmul: group must be 32, 64 or 128");
  KCHECK(w.in % t.group == 0, "int8_matmul: in must be a multiple of the group size");
  t.acts = &a;
  t.y = y;
  t.ldy = ldy ? ldy : w.out;
  KCHECK(t.ldy >= w.out, "int8_matmul: ldy < out");
  return t;
}

// The kernels an ISA runs. AMX machines run the AVX-512 VNNI ones: the tile kernel (int8_rows_amx) sums whole
// scale groups before its fp32 step, the VNNI kernels 8-element words, so a tile form for prefill beside the
// VNNI small-T kernel would give a token other bits in a larger batch; and the tile kernel alone is slow at
// decode (a 16-token tile for one token, the rows unpacked on every call; docs/PERFORMANCE.md).
Isa kernel_isa(Isa isa) { return isa == Isa::kAmx ? Isa::kAvx512Vnni : isa; }

RowsFn rows_fn(Isa isa) {
  switch (kernel_isa(isa)) {
    case Isa::kScalar: return int8_rows_scalar;
    case Isa::kAvx2: return int8_rows_avx2;
    case Isa::kAvx512Vnni: return int8_rows_avx512;
    case Isa::kAmx: break;
  }
  return int8_rows_scalar;
}

// The AVX-512 VNNI GEMM form when `form` asks for it (kAuto: from kInt8GemmMinTokens tokens, in % 128 == 0).
bool use_gemm(const Int8GemmTask& t, Isa isa, Int8Form form) {
  if (kernel_isa(isa) != Isa::kAvx512Vnni || form == Int8Form::kSmallT) return false;
  if (form == Int8Form::kGemm) {
    KCHECK(t.in % 128 == 0, "int8_matmul: the GEMM form needs in % 128 == 0");
    return true;
  }
  return t.acts->T >= kInt8GemmMinTokens && t.in % 128 == 0;
}

constexpr int64_t kGemmRowBlock = 64;  // rows per work item of the GEMM form (one unpacked stripe)

void run_rows(const Int8GemmTask& t, RowsFn fn, int64_t rb = kRowBlock) {
  const int64_t blocks = (t.out + rb - 1) / rb;
  parallel_for(0, blocks, 1, true, [&](int64_t b) { fn(t, b * rb, std::min(t.out, (b + 1) * rb)); });
}

void run_rows(const Int8GemmTask& t, Isa isa, Int8Form form = Int8Form::kAuto) {
  if (use_gemm(t, isa, form)) return run_rows(t, int8_gemm_rows_avx512, kGemmRowBlock);
  run_rows(t, rows_fn(isa));
}

EnvSwitch g_mxfp4_int8("KESTREL_MXFP4_INT8", /*default_on=*/false);
EnvSwitch g_weight_only("KESTREL_W4A8_WEIGHT_ONLY", /*default_on=*/false);

}  // namespace

void int8_matmul_quantized(const WeightMatrix& w, const QuantizedActs& a, float* y, Isa isa, Int8Form form) {
  KCHECK(isa_supported(isa), "int8_matmul: ISA not supported on this CPU");
  run_rows(make_task(w, a, y), isa, form);
}

void int8_matmul_rows(const WeightMatrix& w, const QuantizedActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1, Int8Form form) {
  const Int8GemmTask t = make_task(w, a, y, ldy);
  if (use_gemm(t, active_isa(), form)) return int8_gemm_rows_avx512(t, r0, r1);
  const RowsFn fn = rows_fn(active_isa());
  for (int64_t r = r0; r < r1; r += kRowBlock) fn(t, r, std::min(r1, r + kRowBlock));
}

void int8_matmul_amx_tiles(const WeightMatrix& w, const QuantizedActs& a, float* y) {
  KCHECK(isa_supported(Isa::kAmx), "int8_matmul_amx_tiles: " + isa_unsupported_reason(Isa::kAmx));
  run_rows(make_task(w, a, y), int8_rows_amx);
}

void int8_matmul_amx_emulated(const WeightMatrix& w, const QuantizedActs& a, float* y) {
  run_rows(make_task(w, a, y), int8_rows_amx_emulated);
}

void int8_matmul(const WeightMatrix& w, const float* x, int64_t T, float* y, Isa isa, int64_t ldy) {
  if (T == 0) return;
  thread_local QuantizedActs acts;
  quantize_activations(x, T, w.in, acts);
  run_rows(make_task(w, acts, y, ldy), isa);
}

void int8_matmul(const WeightMatrix& w, const float* x, int64_t T, float* y, int64_t ldy) {
  int8_matmul(w, x, T, y, active_isa(), ldy);
}

bool mxfp4_int8_enabled() { return g_mxfp4_int8.on(); }

void set_mxfp4_int8(bool on) { g_mxfp4_int8.set(on); }

bool w4a8_weight_only() { return g_weight_only.on(); }

void set_w4a8_weight_only(bool on) { g_weight_only.set(on); }

}  // namespace kestrel::kernels
