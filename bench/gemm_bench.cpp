// GEMM/GEMV microbenchmark: y[T, out] = x[T, in] W^T for each weight format, the shapes of
// decode (T = 1), batched decode (T = 16) and prefill (T = 128). Reports wall and CPU time per
// call, GFLOP/s (2·T·out·in) and weight GB/s (bytes of W in its format per call). Weights are
// several times the last-level cache unless --in/--out say otherwise, so decode rows measure DRAM.
//   gemm_bench [format=bf16|f16|f32|mxfp4|all] [out=8192] [in=2048] [iters=20] [T list=1,4,16,128]
#include <omp.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"
#include "tensor/dtype.h"

namespace {

using kestrel::kernels::WeightFormat;
using kestrel::kernels::WeightMatrix;

double wall_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Weights {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  std::vector<uint8_t> packed, scales;
  WeightMatrix m;
  double bytes = 0;
};

// Several copies so that consecutive calls stream from DRAM, not from the cache.
Weights make(const std::string& fmt, int64_t out, int64_t in, std::mt19937& rng) {
  Weights w;
  std::normal_distribution<float> nd(0.0f, 0.05f);
  w.m.out = out, w.m.in = in;
  const size_t n = static_cast<size_t>(out * in);
  if (fmt == "f32") {
    w.f32.resize(n);
    for (auto& v : w.f32) v = nd(rng);
    w.m.format = WeightFormat::kF32, w.m.data = w.f32.data(), w.bytes = 4.0 * static_cast<double>(n);
  } else if (fmt == "bf16" || fmt == "f16") {
    w.half.resize(n);
    for (auto& v : w.half)  // f16: random sign and mantissa, exponent for |v| in [2^-5, 1)
      v = fmt == "bf16" ? kestrel::f32_to_bf16(nd(rng)) : static_cast<uint16_t>((rng() & 0x83ff) | ((10 + rng() % 5) << 10));
    w.m.format = fmt == "bf16" ? WeightFormat::kBF16 : WeightFormat::kF16, w.m.data = w.half.data();
    w.bytes = 2.0 * static_cast<double>(n);
  } else {
    w.packed.resize(n / 2);
    w.scales.resize(n / 32);
    for (auto& v : w.packed) v = static_cast<uint8_t>(rng());
    for (auto& v : w.scales) v = static_cast<uint8_t>(120 + rng() % 8);
    w.m.format = WeightFormat::kMxfp4, w.m.data = w.packed.data(), w.m.scales = w.scales.data();
    w.bytes = static_cast<double>(n / 2 + n / 32);
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string fmt_arg = argc > 1 ? argv[1] : "all";
  const int64_t out = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int64_t in = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int iters = argc > 4 ? std::atoi(argv[4]) : 20;
  std::vector<int64_t> Ts;
  {
    std::stringstream ss(argc > 5 ? argv[5] : "1,4,16,128");
    std::string tok;
    while (std::getline(ss, tok, ',')) Ts.push_back(std::atoll(tok.c_str()));
  }
  std::vector<std::string> fmts = fmt_arg == "all" ? std::vector<std::string>{"bf16", "mxfp4", "f16", "f32"}
                                                   : std::vector<std::string>{fmt_arg};
  std::mt19937 rng(7);
  std::printf("threads %d, W [%lld x %lld]\n%-6s %5s %10s %10s %9s %8s\n", omp_get_max_threads(), static_cast<long long>(out),
              static_cast<long long>(in), "format", "T", "wall ms", "cpu ms", "GFLOP/s", "W GB/s");
  for (const auto& fmt : fmts) {
    constexpr int kCopies = 4;  // 4 × (16..64 MiB): beyond the effective cache
    std::vector<Weights> ws;
    for (int c = 0; c < kCopies; ++c) ws.push_back(make(fmt, out, in, rng));
    for (int64_t T : Ts) {
      std::vector<float> x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& v : x) v = nd(rng);
      kestrel::kernels::matmul(ws[0].m, x.data(), T, y.data());  // warm-up
      const double w0 = wall_s(), c0 = cpu_s();
      for (int i = 0; i < iters; ++i) kestrel::kernels::matmul(ws[static_cast<size_t>(i % kCopies)].m, x.data(), T, y.data());
      const double wall = (wall_s() - w0) / iters, cpu = (cpu_s() - c0) / iters;
      const double flops = 2.0 * static_cast<double>(T * out * in);
      std::printf("%-6s %5lld %10.3f %10.3f %9.1f %8.1f\n", fmt.c_str(), static_cast<long long>(T), 1e3 * wall, 1e3 * cpu,
                  flops / wall * 1e-9, ws[0].bytes / wall * 1e-9);
    }
  }
  return 0;
}
