// KDA core microbenchmark: chunked prefill GFLOP/s and recurrent decode tokens/s (fp32, CPU).
//   kda_bench [H=8] [T=4096] [chunk=64]      (K = V = 128; H = 96 / TP, e.g. 8 for TP=12)
// FLOP count (multiply-add = 2 FLOP, exps not counted), per token per head, chunk C, for the chunked path:
//   Gram L & Aqk 2·C·K + forward substitution C·(K+V) + V' = U − W·S 2·K·V + (q⊙e^Γ)·S 2·K·V
//   + Aqk·V' C·V + state update 2·K·V   =>   F_chunk = 6·K·V + C·(3·K + 2·V)   (139264 for K=V=128, C=64)
// Recurrent path: decay + Sᵀk (3·K·V) and update + Sᵀq (4·K·V) => F_rec = 7·K·V per token per head.
// Decode is measured as T single-token calls (T=1 per call, all heads), the serving pattern.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu/kda.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  using kestrel::kernels::KdaArgs;
  const int64_t H = argc > 1 ? std::atoll(argv[1]) : 8;
  const int64_t T = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t C = argc > 3 ? std::atoll(argv[3]) : 64;
  const int64_t K = 128, V = 128;

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(T * H * K), k(T * H * K), v(T * H * V), g(T * H * K), beta(T * H);
  for (auto* x : {&q, &k}) {
    for (int64_t i = 0; i < T * H; ++i) {
      double ss = 0;
      for (int64_t d = 0; d < K; ++d) ss += std::pow((*x)[i * K + d] = nd(rng), 2);
      for (int64_t d = 0; d < K; ++d) (*x)[i * K + d] /= static_cast<float>(std::sqrt(ss + 1e-6));
    }
  }
  for (auto& x : v) x = nd(rng);
  for (auto& x : g) x = -5.0f / (1.0f + std::exp(-nd(rng) - 2.0f));  // lower-bound-gate-like, in (-5, 0)
  for (auto& x : beta) x = 1.0f / (1.0f + std::exp(-nd(rng)));
  std::vector<float> state(H * K * V, 0.0f), out(T * H * V);

  KdaArgs a;
  a.T = T;
  a.H = H;
  a.K = K;
  a.V = V;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.g = g.data();
  a.beta = beta.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(K));
  a.state = state.data();
  a.out = out.data();

  std::printf("kda_bench: H=%lld T=%lld K=V=128 chunk=%lld threads=%d\n", static_cast<long long>(H),
              static_cast<long long>(T), static_cast<long long>(C), omp_get_max_threads());

  // Chunked prefill.
  const double f_chunk = (6.0 * K * V + static_cast<double>(C) * (3.0 * K + 2.0 * V)) * T * H;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    std::fill(state.begin(), state.end(), 0.0f);
    const double t0 = now_s();
    kestrel::kernels::kda_chunked(a, C);
    best = std::min(best, now_s() - t0);
  }
  std::printf("chunked prefill : %8.2f ms  %7.2f GFLOP/s  %10.0f tokens/s (all H heads)\n", best * 1e3,
              f_chunk / best * 1e-9, T / best);

  // Recurrent over the whole sequence in one call (reference path, prefill-shaped).
  const double f_rec = 7.0 * K * V * T * H;
  best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    std::fill(state.begin(), state.end(), 0.0f);
    const double t0 = now_s();
    kestrel::kernels::kda_recurrent(a);
    best = std::min(best, now_s() - t0);
  }
  std::printf("recurrent (1 call): %6.2f ms  %7.2f GFLOP/s  %10.0f tokens/s\n", best * 1e3, f_rec / best * 1e-9,
              T / best);

  // Decode: one token per call, all heads, state resident (the serving pattern).
  const int64_t steps = std::min<int64_t>(T, 2048);
  best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now_s();
    for (int64_t t = 0; t < steps; ++t) {
      KdaArgs d = a;
      d.T = 1;
      d.q = a.q + t * H * K;
      d.k = a.k + t * H * K;
      d.v = a.v + t * H * V;
      d.g = a.g + t * H * K;
      d.beta = a.beta + t * H;
      d.out = a.out + t * H * V;
      kestrel::kernels::kda_recurrent(d);
    }
    best = std::min(best, now_s() - t0);
  }
  std::printf("recurrent decode: %8.2f us/token  %10.0f tokens/s  %7.2f GFLOP/s (%lld heads, T=1 calls)\n",
              best / steps * 1e6, steps / best, 7.0 * K * V * H * steps / best * 1e-9, static_cast<long long>(H));
  double cs = 0;
  for (float x : out) cs += x;
  std::printf("checksum %.6f\n", cs);
  return 0;
}
