#include "kernels/cpu/w4a8_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "base/check.h"

namespace kestrel::kernels {
namespace {

// AMX needs three things: CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), the OS enabling the
// tile state in XCR0 (bits 17, 18), and, on Linux, a per-process permission for XTILEDATA.
bool cpu_has_amx_bits() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d & (1u << 24)) && (d & (1u << 25));
}

bool os_enables_tiles() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

bool request_tile_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

bool avx512_vnni_ok() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

struct AmxState {
  bool cpu = false, os = false, perm = false;
};

const AmxState& amx_state() {
  static const AmxState s = [] {
    AmxState r;
    r.cpu = cpu_has_amx_bits() && avx512_vnni_ok();
    r.os = r.cpu && os_enables_tiles();
    r.perm = r.os && request_tile_permission();
    return r;
  }();
  return s;
}

// -1: no override; else static_cast<int>(Isa).
std::atomic<int> g_override{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : kAllIsas)
    if (name == isa_name(i)) return i;
  return std::nullopt;
}

std::string isa_unsupported_reason(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "";
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") ? "" : "CPU lacks AVX2";
    case Isa::kAvx512Vnni:
      return avx512_vnni_ok() ? "" : "CPU lacks one of AVX-512 F/BW/VL/VNNI";
    case Isa::kAmx: {
      const AmxState& s = amx_state();
      if (!s.cpu) return "CPU lacks AMX-TILE/AMX-INT8 (CPUID leaf 7 EDX bits 24/25) or AVX-512 VNNI";
      if (!s.os) return "OS has not enabled the AMX tile state in XCR0";
      if (!s.perm) return "the kernel refused the XTILEDATA permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
      return "";
    }
  }
  return "unknown ISA";
}

bool isa_supported(Isa isa) { return isa_unsupported_reason(isa).empty(); }

Isa best_isa() {
  static const Isa best = [] {
    for (Isa i : {Isa::kAmx, Isa::kAvx512Vnni, Isa::kAvx2})
      if (isa_supported(i)) return i;
    return Isa::kScalar;
  }();
  return best;
}

Result<std::optional<Isa>> isa_from_env() {
  const char* v = std::getenv("KESTREL_ISA");
  if (v == nullptr || *v == '\0') return std::optional<Isa>{};
  const auto isa = isa_from_name(v);
  if (!isa) return invalid_argument(std::string("KESTREL_ISA='") + v + "' is not one of scalar, avx2, avx512vnni, amx");
  if (!isa_supported(*isa))
    return unsupported(std::string("KESTREL_ISA=") + v + ": " + isa_unsupported_reason(*isa));
  return std::optional<Isa>{*isa};
}

Isa active_isa() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return static_cast<Isa>(o);
  static const Isa env_or_best = [] {
    auto e = isa_from_env();
    if (!e) panic(e.error().message());
    return e->value_or(best_isa());
  }();
  return env_or_best;
}

void set_isa_override(std::optional<Isa> isa) {
  if (isa) KCHECK(isa_supported(*isa), "set_isa_override: ISA not supported on this CPU");
  g_override.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
}

}  // namespace kestrel::kernels
