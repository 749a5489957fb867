// Prefill attention microbenchmark: one chunk of T queries over ctx earlier positions plus its own, H heads, on
// each path this CPU has (the scalar definition, AVX2 + FMA, and AVX-512 through prefill_attention where present),
// all computing the same bits (checked here too).
//   prefill_attention_bench [H=32] [T=512] [ctx=3584] [Dk=192] [Dv=128] [reps=3] [definition=1]
// definition=0 skips the scalar definition (its timing and the bit check).
// Defaults: the last 512-token chunk of a 4096-token prompt on Kimi-Linear's MLA (32 heads, 128 + 64 key
// dims, 128 value dims). FLOP: 2·(Dk + Dv) per (query, visible key) pair, per head; exps not counted.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/prefill_attention.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  namespace k = kestrel::kernels;
  auto arg = [&](int i, int64_t dflt) { return argc > i ? std::atoll(argv[i]) : dflt; };
  const int64_t H = arg(1, 32), T = arg(2, 512), ctx = arg(3, 3584), Dk = arg(4, 192), Dv = arg(5, 128), reps = arg(6, 3);
  const bool definition = arg(7, 1) != 0;
  const int64_t L = ctx + T, ks = k::packed_key_floats(L, Dk);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(T * H * Dk), kt(H * ks, 0.0f), v(H * L * Dv), key(Dk);
  for (float& x : q) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < L; ++j) {
      for (float& x : key) x = nd(rng);
      k::pack_key_part(kt.data() + h * ks, Dk, j, 0, key.data(), Dk);
    }
  k::PrefillAttentionArgs a;
  a.T = T, a.L = L, a.H = H, a.Dk = Dk, a.Dv = Dv;
  a.q = q.data(), a.kt = kt.data(), a.kt_head_stride = ks, a.v = v.data(), a.v_head_stride = L * Dv;
  a.scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  const double pairs = static_cast<double>(T) * ctx + T * (T + 1) / 2.0;
  const double flop = 2.0 * (Dk + Dv) * pairs * H;
  std::printf("prefill_attention_bench: H=%lld T=%lld ctx=%lld Dk=%lld Dv=%lld threads=%d\n", (long long)H, (long long)T,
              (long long)ctx, (long long)Dk, (long long)Dv, omp_get_max_threads());

  std::vector<float> want(T * H * Dv), got(want.size());
  auto time_path = [&](const char* name, void (*fn)(const k::PrefillAttentionArgs&), std::vector<float>& out, int64_t n) {
    a.out = out.data();
    double best = 1e30;
    for (int64_t r = 0; r < n; ++r) {
      const double t0 = now_s();
      fn(a);
      best = std::min(best, now_s() - t0);
    }
    std::printf("%-22s %9.2f ms  %7.2f GFLOP/s\n", name, best * 1e3, flop / best * 1e-9);
    return best;
  };
  // The definition runs one (query, head) at a time on every thread, as prefill_attention does without a vector path.
  auto reference = [](const k::PrefillAttentionArgs& x) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < x.T; ++t) {
      k::PrefillAttentionArgs r = x;
      r.T = 1, r.L = x.L - x.T + t + 1, r.q = x.q + t * x.H * x.Dk, r.out = x.out + t * x.H * x.Dv;
      k::prefill_attention_reference(r);
    }
  };
  const double t_ref = definition ? time_path("scalar definition", reference, want, 1) : 0.0;
  int bad = 0;
  if (k::prefill_attention_avx2_supported()) {
    const double t = time_path("avx2+fma", k::prefill_attention_avx2, got, reps);
    bad += definition && std::memcmp(got.data(), want.data(), got.size() * 4) != 0;
    if (definition) std::printf("avx2+fma / scalar: %.2fx\n", t_ref / t);
  }
  const double t = time_path("prefill_attention", k::prefill_attention, got, reps);
  bad += definition && std::memcmp(got.data(), want.data(), got.size() * 4) != 0;
  if (definition) {
    std::printf("prefill_attention / scalar: %.2fx\n", t_ref / t);
    std::printf("bits equal to the definition: %s\n", bad ? "NO" : "yes");
  }
  return bad ? 1 : 0;
}
