// Linear kernel microbenchmark: y[T, out] = x[T, in] W^T for every weight format, best of N calls.
//   linear_bench [out=4096] [in=4096] [T=1] [reps=20]
// Reports ms per call, (int or fp) ops per second, and weight bytes read per second (the decode-time limit: T = 1 reads every
// weight byte once). Formats: F32 (fp32 weights used in place), BF16, MXFP4 (compressed-tensors: packed + separate E8M0 scales, fused
// decode+dot for T ≤ 4), W4A8 (int4, bf16 scales per 32; int8 activations), GGUF Q8_0 / Q4_0 (its packed rows) / MXFP4 blocks
// (int8 activations in the default GGUF mode).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"

namespace {

using kestrel::kernels::WeightFormat;
using kestrel::kernels::WeightMatrix;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Fmt {
  const char* name;
  WeightFormat f;
  bool act_bf16 = false;  // BF16 only: bf16-rounded activations on vdpbf16ps (bf16_dot.h; GGUF default, --kernels fast)
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t out = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t in = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t T = argc > 3 ? std::atoll(argv[3]) : 1;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20;
  if (in % 32 != 0) return std::fprintf(stderr, "in must be a multiple of 32\n"), 2;
  std::mt19937 rng(1);
  std::vector<float> x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& v : x) v = d(rng);
  std::printf("linear_bench out %ld in %ld T %ld (best of %d)\n", static_cast<long>(out), static_cast<long>(in),
              static_cast<long>(T), reps);
  for (const Fmt& f : {Fmt{"F32", WeightFormat::kF32}, Fmt{"BF16", WeightFormat::kBF16}, Fmt{"BF16 x bf16 acts", WeightFormat::kBF16, true}, Fmt{"MXFP4 (compressed-tensors)", WeightFormat::kMxfp4},
                       Fmt{"W4A8 (group 32)", WeightFormat::kW4A8},
                       Fmt{"GGUF Q8_0", WeightFormat::kGgufQ8_0}, Fmt{"GGUF Q4_0", WeightFormat::kGgufQ4_0},
                       Fmt{"GGUF MXFP4", WeightFormat::kGgufMxfp4}}) {
    const int64_t bb = kestrel::kernels::gguf_block_bytes(f.f);
    const int64_t bytes = f.f == WeightFormat::kF32 ? out * in * 4 : f.f == WeightFormat::kBF16 ? out * in * 2 : (f.f == WeightFormat::kMxfp4 || f.f == WeightFormat::kW4A8) ? out * in / 2 : out * in / 32 * bb;
    const int64_t scale_bytes = f.f == WeightFormat::kW4A8 ? out * in / 32 * 2 : out * in / 32;
    std::vector<uint8_t> data(static_cast<size_t>(bytes)), scales(static_cast<size_t>(scale_bytes));
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 8);  // E8M0 near 2^0; W4A8: bf16 near 2^-6 .. 2^-5
    if (f.f == WeightFormat::kF32)  // floats in [1, 2) from the random bytes (finite, no denormals)
      for (int64_t i = 0; i < out * in; ++i) data[static_cast<size_t>(4 * i + 3)] = 0x3f, data[static_cast<size_t>(4 * i + 2)] |= 0x80;
    if (f.f == WeightFormat::kBF16)
      for (int64_t i = 0; i < out * in; ++i) data[static_cast<size_t>(2 * i + 1)] = static_cast<uint8_t>(0x3c + rng() % 2);
    for (int64_t b = 0; bb > 0 && b < out * in / 32; ++b) {  // finite fp16 scales / E8M0 near 2^0
      uint8_t* p = data.data() + b * bb;
      if (f.f == WeightFormat::kGgufMxfp4) p[0] = static_cast<uint8_t>(120 + rng() % 8);
      else p[1] = static_cast<uint8_t>(0x1c + rng() % 4);
    }
    WeightMatrix w;
    w.format = f.f, w.out = out, w.in = in, w.data = data.data(), w.act_bf16 = f.act_bf16;
    if (f.f == WeightFormat::kMxfp4 || f.f == WeightFormat::kW4A8) w.scales = scales.data();
    if (f.f == WeightFormat::kW4A8) w.group = 32;
    kestrel::AlignedVector<uint8_t> rows16;  // Q4_0: the int8 products read the packed rows (gguf_q4_x16.h)
    if (f.f == WeightFormat::kGgufQ4_0) rows16 = kestrel::kernels::pack_q4_0_x16(w), w.packed = rows16.data();
    double best = 1e30;
    for (int r = 0; r < reps + 1; ++r) {
      const double t0 = now_s();
      kestrel::kernels::matmul(w, x.data(), T, y.data());
      if (r > 0) best = std::min(best, now_s() - t0);  // first call warms caches / thread pool
    }
    const double total = static_cast<double>(bytes + (f.f == WeightFormat::kMxfp4 || f.f == WeightFormat::kW4A8 ? scale_bytes : 0));
    std::printf("  %-28s %8.3f ms   %6.2f GB/s of weights   %7.1f G(FL)OP/s\n", f.name, best * 1e3, total / best / 1e9,
                2.0 * static_cast<double>(out * in * T) / best / 1e9);
  }
  return 0;
}
