// Run-time CPU-feature dispatch for the int8-activation kernels (W4A8 and MXFP4 × int8).
// One binary runs everywhere: each path is compiled with __attribute__((target(...))) and picked at
// run time. The choice is overridable for tests and benchmarks: set_isa_override(), or the
// environment variable KESTREL_ISA=scalar|avx2|avx512vnni|amx (read once, validated by the CLI).
// Thread-safety: all functions are safe to call from any thread; the override is an atomic.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"

namespace kestrel::kernels {

enum class Isa { kScalar, kAvx2, kAvx512Vnni, kAmx };
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAmx};

const char* isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);

// Whether this CPU (and OS) can run the path. For AMX that includes the Linux XTILEDATA permission
// (arch_prctl ARCH_REQ_XCOMP_PERM), requested on first call.
bool isa_supported(Isa isa);
// Empty when supported; otherwise why not (for test skips and CLI errors).
std::string isa_unsupported_reason(Isa isa);
// The fastest supported path (AMX > AVX-512 VNNI > AVX2 > scalar).
Isa best_isa();

// KESTREL_ISA parsed and checked: nullopt when unset; an error for an unknown or unsupported name.
Result<std::optional<Isa>> isa_from_env();
// The path kernels use: the override if set, else KESTREL_ISA if set, else best_isa().
// An invalid KESTREL_ISA reaching here panics (the CLI validates it first with isa_from_env()).
Isa active_isa();
// nullopt clears. Panics on an unsupported ISA (a programming error in the caller).
void set_isa_override(std::optional<Isa> isa);

}  // namespace kestrel::kernels
