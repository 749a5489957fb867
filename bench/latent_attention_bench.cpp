// Latent attention (MLA's absorbed form) at depth: one decode step, or a chunk of T queries, over L cached rows,
// through causal_attention as a model's layers call it, the rows of every layer in their own pages so a step
// streams them from memory as decode does (27 layers of 4096 fp32 rows of DeepSeek-V2-Lite: 255 MB).
//   latent_attention_bench [L=4096] [layers=27] [T=1] [H=16] [lora=512] [rope=64] [reps=5] [dtype=f32|bf16|fp8]
// Reports the best of reps steps: ms per step, rows read (GB/s, each layer's rows counted once), GFLOP/s
// (2·(Dk + Dv) per (query, visible row, head); exps not counted) and ns per (visible row, head) per thread.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_row.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  namespace k = kestrel::kernels;
  auto arg = [&](int i, int64_t dflt) { return argc > i ? std::atoll(argv[i]) : dflt; };
  const int64_t L = arg(1, 4096), layers = arg(2, 27), T = arg(3, 1), H = arg(4, 16), lora = arg(5, 512),
                rope = arg(6, 64), reps = arg(7, 5);
  const std::string dt = argc > 8 ? argv[8] : "f32";
  k::KvRowFormat f;
  f.lora = lora, f.rope = rope;
  f.dtype = dt == "bf16" ? kestrel::KvCacheDtype::kBF16 : dt == "fp8" ? kestrel::KvCacheDtype::kFP8 : kestrel::KvCacheDtype::kF32;
  if (T < 1 || T > L || layers < 1) {
    std::fprintf(stderr, "latent_attention_bench: need 1 <= T <= L and layers >= 1\n");
    return 2;
  }
  const int64_t page_tokens = 64, pages = (L + page_tokens - 1) / page_tokens, row_bytes = f.bytes();
  const int64_t Dk = lora + rope, Dv = lora;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<uint8_t>> store(static_cast<size_t>(layers));
  std::vector<std::vector<const uint8_t*>> page_ptrs(static_cast<size_t>(layers));
  std::vector<float> row(static_cast<size_t>(Dk));
  for (int64_t l = 0; l < layers; ++l) {
    store[l].resize(static_cast<size_t>(pages * page_tokens * row_bytes));
    for (int64_t j = 0; j < L; ++j) {
      for (float& x : row) x = nd(rng);
      k::kv_store_row(f, row.data(), store[l].data() + j * row_bytes);
    }
    for (int64_t p = 0; p < pages; ++p) page_ptrs[l].push_back(store[l].data() + p * page_tokens * row_bytes);
  }
  std::vector<float> q(static_cast<size_t>(T * H * Dk)), out(static_cast<size_t>(T * H * Dv));
  for (float& x : q) x = nd(rng);
  k::AttentionArgs a;
  a.T = T, a.L = L, a.H = H, a.Dk = Dk, a.Dv = Dv, a.q = q.data(), a.page_tokens = page_tokens, a.row = f;
  a.scale = 1.0f / std::sqrt(static_cast<float>(Dk)), a.out = out.data();
  double best = 1e30;
  for (int64_t r = 0; r < reps + 1; ++r) {  // the first step warms the threads and is not counted
    const double t0 = now_s();
    for (int64_t l = 0; l < layers; ++l) {
      a.pages = page_ptrs[l].data();
      k::causal_attention(a);
    }
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  const double visible = static_cast<double>(T) * (L - T) + T * (T + 1) / 2.0;  // (query, row) pairs per layer
  const double pairs = visible * H * layers;
  std::printf("latent_attention_bench: L=%lld layers=%lld T=%lld H=%lld Dk=%lld Dv=%lld %s threads=%d\n",
              (long long)L, (long long)layers, (long long)T, (long long)H, (long long)Dk, (long long)Dv, dt.c_str(),
              omp_get_max_threads());
  std::printf("step %8.2f ms  rows %6.1f GB/s  %7.2f GFLOP/s  %6.2f ns per (row, head) per thread\n", best * 1e3,
              static_cast<double>(L * row_bytes * layers) / best * 1e-9, 2.0 * (Dk + Dv) * pairs / best * 1e-9,
              best * 1e9 * omp_get_max_threads() / pairs);
  return 0;
}
