#include "kernels/cpu/gguf_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/env_switch.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/w4a8_isa.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

EnvSwitch g_enabled("KESTREL_GGUF_INT8", /*default_on=*/true);

// The AVX-512 kernels run (AMX machines have AVX-512 VNNI too).
bool wide_isa() {
  const Isa isa = active_isa();
  return isa == Isa::kAvx512Vnni || isa == Isa::kAmx;
}

// The AVX2 kernel's instructions are there (every AVX2 CPU so far has FMA and F16C; checked anyway).
bool avx2_kernel_runs() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && [] {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    return (c & (1u << 29)) != 0;  // CPUID.1:ECX.F16C
  }();
  return yes;
}

// AVX-512 executed as two 256-bit halves: AMD family 19h with AVX-512 (Zen 4; Zen 3, the same family,
// has none). Zen 5 (family 1Ah) and Intel's cores have full-width 512-bit units.
bool half_width_avx512() {
  static const bool yes = [] {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    const unsigned family = ((a >> 8) & 15u) + (((a >> 8) & 15u) == 15u ? (a >> 20) & 255u : 0u);
    return amd && family == 0x19;
  }();
  return yes;
}

}  // namespace

void q8_acts_prepare(Q8Acts& a, int64_t T, int64_t in, bool gemm_q4, bool gemm_q8, bool gemm_mx) {
  KCHECK(in % 32 == 0, "quantize_q8_0_acts: in must be a multiple of 32");
  a.T = T, a.in = in, a.nb = in / 32, a.nc = (a.nb + 3) / 4;
  a.gemm_q4 = gemm_q4, a.gemm_q8 = gemm_q8, a.gemm_mx = gemm_mx;
  const size_t n = static_cast<size_t>(T * a.nc * 128);
  if (a.q.size() < n) a.q.resize(n), a.qg.resize(n);
  if (a.comp.size() < n / 8) a.comp.resize(n / 8);
  if (a.d.size() < n / 32) a.d.resize(n / 32);
  if (gemm_q4 && a.n4.size() < n / 8) a.n4.resize(n / 8);
  if (gemm_mx && a.n12.size() < n / 8) a.n12.resize(n / 8);
  if (gemm_mx && a.dx4.size() < n / 8) a.dx4.resize(n / 8);
  if (gemm_q8 && a.n8.size() < n / 4) a.n8.resize(n / 4), a.dx8.resize(n / 4);
}

void quantize_q8_0_acts(const float* x, int64_t T, int64_t in, Q8Acts& a) {
  q8_acts_prepare(a, T, in);
  q8_acts_fill(x, 0, T, a);
}

void q8_acts_fill(const float* x, int64_t t0, int64_t t1, Q8Acts& a) {
  for (int64_t t = t0; t < t1; ++t) q8_acts_fill_chunks(x + t * a.in, t, 0, a.nc, a);
}

void q8_acts_fill_chunks(const float* xr, int64_t t, int64_t c0, int64_t c1, Q8Acts& a) {
  const int64_t P = a.nc * 128;
  int8_t* q = a.q.data() + t * P;
  int8_t* qg = a.qg.data() + t * P;
  int32_t* comp = a.comp.data() + t * (P / 8);
  float* d = a.d.data() + t * (P / 32);
  for (int64_t b = 4 * c0; b < 4 * c1; ++b) {
    int8_t* qb = q + b * 32;
    const int64_t c = b / 4, k = b % 4;
    if (b >= a.nb) {
      std::memset(qb, 0, 32);
      d[b] = 0;
    } else {
      const float* v = xr + b * 32;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
      d[b] = f16_to_f32(f32_to_f16(amax / 127.0f));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (int j = 0; j < 32; ++j) qb[j] = static_cast<int8_t>(std::nearbyint(v[j] * id));
    }
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += qb[j];
    std::memcpy(qg + c * 128 + k * 16, qb, 16);
    std::memcpy(qg + c * 128 + 64 + k * 16, qb + 16, 16);
    for (int i = 0; i < 4; ++i) comp[c * 16 + k * 4 + i] = i == 0 ? s : 0;
  }
  if (a.gemm_mx) {
    float* dx4 = a.dx4.data() + t * (P / 8);
    for (int64_t l = 16 * c0; l < 16 * c1; ++l) dx4[l] = d[(l / 16) * 4 + (l % 16) / 4];
  }
  if (a.gemm_q4) {
    int32_t* n4 = a.n4.data() + t * (P / 8);
    for (int64_t l = 16 * c0; l < 16 * c1; ++l) n4[l] = -8 * comp[l];
  }
  if (a.gemm_mx) {
    int32_t* n12 = a.n12.data() + t * (P / 8);
    for (int64_t l = 16 * c0; l < 16 * c1; ++l) n12[l] = -12 * comp[l];
  }
  if (a.gemm_q8) {
    int32_t* n8 = a.n8.data() + t * (P / 4);
    float* dx8 = a.dx8.data() + t * (P / 4);
    for (int64_t l = 32 * c0; l < 32 * c1; ++l) {  // chunk l/32, half (l%32)/16, lane l%16
      const int8_t* e = q + 4 * l;
      n8[l] = -128 * (e[0] + e[1] + e[2] + e[3]);
      dx8[l] = d[(l / 32) * 4 + ((l % 32) / 16) * 2 + (l % 16) / 8];
    }
  }
}

bool is_gguf_int8_format(WeightFormat f) {
  return f == WeightFormat::kGgufQ4_0 || f == WeightFormat::kGgufQ8_0 || f == WeightFormat::kGgufMxfp4;
}

bool gguf_int8_enabled() { return g_enabled.on(); }

void set_gguf_int8(bool on) { g_enabled.set(on); }

bool gguf_int8_applies(const WeightMatrix& w) {
  if (!is_gguf_int8_format(w.format) || !gguf_int8_enabled()) return false;
  if (w.format == WeightFormat::kGgufQ4_0 && w.packed == nullptr) return false;  // Q4_0 runs on its packed rows only
  // AMX machines have AVX-512 VNNI too; a forced scalar ISA turns the int8 mode off.
  const Isa isa = active_isa();
  return isa == Isa::kAvx512Vnni || isa == Isa::kAmx || (isa == Isa::kAvx2 && avx2_kernel_runs());
}

int64_t gguf_int8_gemm_min_tokens(WeightFormat f) {
  if (!wide_isa()) return kGgufGemmMinTokensAvx2;
  if (!half_width_avx512()) return kGgufGemmMinTokens;
  // Where each 512-bit op takes two issue slots, the GEMM tile's scale product, conversion and FMA per
  // pair of vpdpbusd cost as much as the MXFP4 small-T kernel's in-register unpack saves up to 32
  // tokens: one core of an AMD EPYC Zen 4, small-T / GEMM ms (`w4a8_bench` BM_GgufInt8, 2048 × 2048):
  // MXFP4 T = 16 1.04 / 1.18, 32 2.03 / 2.02, 128 8.36 / 7.16; Q8_0 16 1.49 / 1.33, 512 48.5 / 38.8.
  return f == WeightFormat::kGgufMxfp4 ? 64 : kGgufGemmMinTokens;
}

bool gguf_int8_runs_packed(const WeightMatrix& w) {
  return w.format == WeightFormat::kGgufQ4_0 || (w.format == WeightFormat::kGgufMxfp4 && w.packed != nullptr);
}

bool gguf_int8_layout_wanted(const WeightMatrix& w, int64_t T) {
  if (gguf_int8_runs_packed(w)) return T > 0;  // the packed kernels read −8·Σq per block (n4)
  if (gguf_int8_gemm_applies(w.format, T)) return true;
  return T > 0 && wide_isa() && w.format != WeightFormat::kGgufQ8_0 && gguf_int8_vbmi_applies(w);
}

Q8Layouts gguf_int8_layout(const WeightMatrix& w, int64_t T) {
  Q8Layouts l;
  if (!gguf_int8_layout_wanted(w, T)) return l;
  if (gguf_int8_runs_packed(w)) l.q4 = true;  // whatever the format: −8·Σq per block
  else if (w.format == WeightFormat::kGgufQ8_0) l.q8 = true;
  else if (w.format == WeightFormat::kGgufMxfp4) l.mx = true;
  return l;
}

bool gguf_int8_gemm_applies(WeightFormat f, int64_t T) {
  if (!gguf_int8_gemm_format(f)) return false;
  if (wide_isa()) return T >= gguf_int8_gemm_min_tokens(f);
  return active_isa() == Isa::kAvx2 && avx2_kernel_runs() && T >= kGgufGemmMinTokensAvx2;
}

void gguf_int8_product(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (gguf_int8_runs_packed(w)) return gguf_int8_product_at(w, a, nullptr, a.T, y, ldy, r0, r1);
  const bool gemm = gguf_int8_gemm_applies(w.format, a.T);
  if (wide_isa()) return gemm ? gguf_int8_gemm_rows(w, a, y, ldy, r0, r1) : gguf_int8_rows_avx512(w, a, y, ldy, r0, r1);
  KCHECK(avx2_kernel_runs(), "gguf_int8: no int8 kernel for this CPU (needs AVX-512 VNNI or AVX2 + FMA + F16C)");
  if (gemm) return gguf_int8_gemm_rows_avx2(w, a, y, ldy, r0, r1);
  gguf_int8_rows_avx2(w, a, y, ldy, r0, r1);
}

void gguf_int8_product_at(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy,
                          int64_t r0, int64_t r1) {
  if (gguf_int8_runs_packed(w)) {  // one kernel at every T (gguf_q4_x16.h)
    // AMX: the tile form from kQ4x16AmxMinTokens tokens (same bits as the AVX-512 kernel at any T).
    if (active_isa() == Isa::kAmx && n >= kQ4x16AmxMinTokens) return q4_x16_rows_amx(w, a, tok, n, y, ldy, r0, r1);
    if (wide_isa()) return q4_x16_rows_avx512(w, a, tok, n, y, ldy, r0, r1);
    KCHECK(avx2_kernel_runs(), "gguf_int8: no int8 kernel for this CPU (needs AVX-512 VNNI or AVX2 + FMA + F16C)");
    return q4_x16_rows_avx2(w, a, tok, n, y, ldy, r0, r1);
  }
  const bool gemm = gguf_int8_gemm_applies(w.format, n);
  if (wide_isa()) return gemm ? gguf_int8_gemm_rows_at(w, a, tok, n, y, ldy, r0, r1) : gguf_int8_rows_at(w, a, tok, n, y, ldy, r0, r1);
  KCHECK(avx2_kernel_runs(), "gguf_int8: no int8 kernel for this CPU (needs AVX-512 VNNI or AVX2 + FMA + F16C)");
  if (gemm) return gguf_int8_gemm_rows_at_avx2(w, a, tok, n, y, ldy, r0, r1);
  gguf_int8_rows_at_avx2(w, a, tok, n, y, ldy, r0, r1);
}

void gguf_int8_rows_scalar(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  KCHECK(w.format == WeightFormat::kGgufQ8_0 || w.format == WeightFormat::kGgufMxfp4,
         "gguf_int8_rows_scalar: Q8_0 / MXFP4 only (Q4_0's reference is q4_x16_rows_model, gguf_q4_x16.h)");
  KCHECK(w.in == a.in, "gguf_int8: shape mismatch");
  const int64_t bb = gguf_block_bytes(w.format), nb = a.nb, P = a.nc * 128;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * nb * bb;
    for (int64_t t = 0; t < a.T; ++t) {
      const int8_t* q = a.q.data() + t * P;
      float sum = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bb;
        const int8_t* qb = q + b * 32;
        int32_t isum = 0;
        float dw = 0;
        switch (w.format) {
          case WeightFormat::kGgufQ8_0: {
            dw = gguf_load_f16(blk);
            const int8_t* wq = reinterpret_cast<const int8_t*>(blk + 2);
            for (int j = 0; j < 32; ++j) isum += wq[j] * qb[j];
            break;
          }
          default:  // MXFP4
            dw = gguf_e8m0_half(blk[0]);
            for (int j = 0; j < 16; ++j)
              isum += kGgufE2M1Doubled[blk[1 + j] & 15] * qb[j] + kGgufE2M1Doubled[blk[1 + j] >> 4] * qb[j + 16];
            break;
        }
        sum += static_cast<float>(isum) * (dw * a.d[static_cast<size_t>(t * (P / 32) + b)]);
      }
      y[t * ldy + r] = sum;
    }
  }
}

}  // namespace kestrel::kernels
