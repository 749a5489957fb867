// Internal to kernels/cpu: the AMX tile unit as the int8 tile kernels use it, twice over. HwTiles runs the
// instructions; EmuTiles executes the same calls in C++ (the Intel SDM pseudocode for TDPBUSD / TDPBSSD),
// so a kernel written once as a template over the unit is tested on every CPU and run on AMX hardware.
//
// Registers are compile-time numbers (template arguments). GCC 12 hazard (docs/model-math.md §9.1): its
// _tile_loadconfig declares an 8-byte memory read, so the stores filling the 64-byte config are
// dead-store-eliminated and tiles stay unconfigured (#UD). No GCC tile intrinsic is used: every tile
// instruction is our own asm. ldtilecfg takes the whole 64-byte struct as its "m" operand (the compiler
// must materialise all of it), and tileloadd / tilestored carry a "memory" clobber (GCC's versions pass only
// the pointer in a register, so stores to the buffers they read are not ordered before them).
// Callers on hardware check isa_supported(Isa::kAmx) first: it also asks Linux for the XTILEDATA permission.
#pragma once

#include <cstdint>
#include <cstring>

namespace kestrel::kernels::amx {

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  // Register r: `rows` rows of `colsb` bytes.
  TileConfig& tile(int r, int nrows, int ncolsb) {
    rows[r] = static_cast<uint8_t>(nrows), colsb[r] = static_cast<uint16_t>(ncolsb);
    return *this;
  }
};
static_assert(sizeof(TileConfig) == 64);

#define KESTREL_AMX_ATTR __attribute__((target("amx-tile,amx-int8"))) inline
// One asm per register number (the register is part of the instruction's text).
#define KESTREL_AMX_REG_SWITCH(R, STMT) \
  static_assert(R >= 0 && R < 8, "AMX tile register 0..7");                                   \
  if constexpr (R == 0) STMT("0") else if constexpr (R == 1) STMT("1") else if constexpr (R == 2) STMT("2") \
  else if constexpr (R == 3) STMT("3") else if constexpr (R == 4) STMT("4") else if constexpr (R == 5) STMT("5") \
  else if constexpr (R == 6) STMT("6") else STMT("7")

struct HwTiles {
  static KESTREL_AMX_ATTR void config(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" ::"m"(c)); }
  static KESTREL_AMX_ATTR void release() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int R>
  static KESTREL_AMX_ATTR void zero() {
#define KESTREL_AMX_ZERO(N) { __asm__ volatile("tilezero %%tmm" N ::: "memory"); }
    KESTREL_AMX_REG_SWITCH(R, KESTREL_AMX_ZERO);
#undef KESTREL_AMX_ZERO
  }
  template <int R>
  static KESTREL_AMX_ATTR void load(const void* p, int64_t stride) {
#define KESTREL_AMX_LOAD(N) { __asm__ volatile("tileloadd (%0,%1,1), %%tmm" N ::"r"(p), "r"(stride) : "memory"); }
    KESTREL_AMX_REG_SWITCH(R, KESTREL_AMX_LOAD);
#undef KESTREL_AMX_LOAD
  }
  template <int R>
  static KESTREL_AMX_ATTR void store(void* p, int64_t stride) {
#define KESTREL_AMX_STORE(N) { __asm__ volatile("tilestored %%tmm" N ", (%0,%1,1)" ::"r"(p), "r"(stride) : "memory"); }
    KESTREL_AMX_REG_SWITCH(R, KESTREL_AMX_STORE);
#undef KESTREL_AMX_STORE
  }
  // C += A · B over 4-byte groups: dpbusd A unsigned, B signed; dpbssd both signed. The (C, A, B) register
  // triples the kernels use are spelled out (the asm text names all three).
  template <int C, int A, int B>
  static KESTREL_AMX_ATTR void dpbusd() {
    static_assert(C == 0 && A == 1 && B == 2, "HwTiles::dpbusd: add the register triple");
    __asm__ volatile("tdpbusd %%tmm2, %%tmm1, %%tmm0" ::: "memory");
  }
  template <int C, int A, int B>
  static KESTREL_AMX_ATTR void dpbssd() {
#define KESTREL_TDPBSSD(c, a, b) \
  if constexpr (C == c && A == a && B == b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory"); else
    KESTREL_TDPBSSD(0, 2, 4) KESTREL_TDPBSSD(1, 3, 5) KESTREL_TDPBSSD(6, 2, 4) KESTREL_TDPBSSD(7, 3, 5)
    static_assert(C < 0, "HwTiles::dpbssd: add the register triple");
#undef KESTREL_TDPBSSD
  }
};

#undef KESTREL_AMX_REG_SWITCH
#undef KESTREL_AMX_ATTR

// C++ model of the eight tile registers (per thread, as the hardware's are).
struct EmuTiles {
  struct State {
    TileConfig cfg;
    uint8_t t[8][16][64];
  };
  static State& s() {
    thread_local State st;
    return st;
  }
  static void config(const TileConfig& c) { s().cfg = c, std::memset(s().t, 0, sizeof s().t); }
  static void release() {}
  template <int R>
  static void zero() {
    std::memset(s().t[R], 0, sizeof s().t[R]);
  }
  template <int R>
  static void load(const void* p, int64_t stride) {
    std::memset(s().t[R], 0, sizeof s().t[R]);
    for (int r = 0; r < s().cfg.rows[R]; ++r)
      std::memcpy(s().t[R][r], static_cast<const uint8_t*>(p) + r * stride, s().cfg.colsb[R]);
  }
  template <int R>
  static void store(void* p, int64_t stride) {
    for (int r = 0; r < s().cfg.rows[R]; ++r)
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, s().t[R][r], s().cfg.colsb[R]);
  }
  template <int C, int A, int B>
  static void dpbusd() {
    dp<C, A, B, false>();
  }
  template <int C, int A, int B>
  static void dpbssd() {
    dp<C, A, B, true>();
  }

 private:
  // SDM: for m < rows(C), k < colsb(A)/4, n < colsb(C)/4: C[m][n] += Σ_i A[m][4k+i] · B[k][4n+i].
  template <int C, int A, int B, bool SignedA>
  static void dp() {
    State& st = s();
    for (int m = 0; m < st.cfg.rows[C]; ++m)
      for (int k = 0; k < st.cfg.colsb[A] / 4; ++k)
        for (int n = 0; n < st.cfg.colsb[C] / 4; ++n) {
          int32_t c;
          std::memcpy(&c, &st.t[C][m][4 * n], 4);
          for (int i = 0; i < 4; ++i) {
            const int32_t a = SignedA ? static_cast<int32_t>(static_cast<int8_t>(st.t[A][m][4 * k + i]))
                                      : static_cast<int32_t>(st.t[A][m][4 * k + i]);
            c += a * static_cast<int8_t>(st.t[B][k][4 * n + i]);
          }
          std::memcpy(&st.t[C][m][4 * n], &c, 4);
        }
  }
};

}  // namespace kestrel::kernels::amx
