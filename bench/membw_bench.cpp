// DRAM read bandwidth: the decode roofline (tokens/s ≤ GB/s ÷ weight bytes per token).
//   membw_bench [GiB=2] [reps=5]   — best of reps full passes over the buffer, OpenMP threads.
// AVX-512 loads into 8 independent accumulators per thread (GCC vector extensions elsewhere).
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {
typedef int64_t v8i __attribute__((vector_size(64)));
}

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? static_cast<size_t>(std::atoll(argv[1])) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const size_t n = gib << 30, words = n / 64;
  std::vector<v8i> buf(words);
  std::memset(static_cast<void*>(buf.data()), 1, n);
  double best = 0;
  int64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
      v8i a[8] = {};
#pragma omp for schedule(static)
      for (size_t i = 0; i < words; i += 8)
        for (int k = 0; k < 8; ++k) a[k] += buf[i + static_cast<size_t>(k)];
      for (int k = 1; k < 8; ++k) a[0] += a[k];
      for (int k = 0; k < 8; ++k) total += a[0][k];
    }
    sink += total;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) / s * 1e-9);
  }
  std::printf("threads %d  buffer %zu GiB  read %.1f GB/s  (checksum %lld)\n", omp_get_max_threads(), gib, best,
              static_cast<long long>(sink & 0xff));
  return 0;
}
