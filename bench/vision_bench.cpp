// Vision encoder benchmark: milliseconds per image through a model's vision tower + projector (Engine::encode_images,
// one image per batch) at square grids of 256 / 1024 / 4096 image tokens, and the GFLOP/s that gives against a FLOP
// model of the tower (docs/PERFORMANCE.md "Vision encoder"), as a share of the fp32 peak measured in the same run (an
// FMA loop on every thread: 12 independent 16-lane accumulators per thread, 2 FLOP per lane per FMA), measured
// again right before each size (on a shared machine the cores' availability drifts). Pixels are random (the cost
// does not depend on them).
//
//   vision_bench MODEL_DIR [TOKENS,...] [REPS] [JSON_OUT]     e.g. vision_bench /tmp/vt27 256,1024 3 out.json
//
// FLOP model (multiply-add = 2), n patches, tower widths D, q/k/v width Q, MLP width I, L blocks:
//   patch embedding 2·n·(3·p²)·D; per block 2·n·D·3Q (qkv) + 4·n²·Q (scores and values over all heads)
//   + 2·n·Q·D (output) + 4·n·D·I (MLP); projector 2·(n/4)·(its matrix parameters). Norms, RoPE, softmax, GELU and
//   the position-grid interpolation are left out (elementwise, < 1 % here).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loader/vision_config.h"
#include "runtime/engine.h"

namespace {

double tower_flops(const kestrel::VisionConfig& v, int64_t n) {
  const double D = v.hidden, Q = v.qkv_hidden, I = v.intermediate, p = v.patch_size, N = static_cast<double>(n);
  double f = 2 * N * 3 * p * p * D;
  f += v.num_layers * (2 * N * D * 3 * Q + 4 * N * N * Q + 2 * N * Q * D + 4 * N * D * I);
  double projector_params = 0;
  for (const kestrel::VisionTensor& t : kestrel::vision_tensors(v))
    if (t.name.rfind("mm_projector.", 0) == 0 && t.shape.size() == 2)
      projector_params += static_cast<double>(t.shape[0]) * static_cast<double>(t.shape[1]);
  return f + 2 * (N / (v.merge_h * v.merge_w)) * projector_params;
}

// fp32 FMA throughput of all OpenMP threads together, GFLOP/s (best of 5 runs of ~0.2 s).
double fma_peak_gflops() {
#if defined(__AVX512F__)
  constexpr int kAcc = 12;
  constexpr int64_t kIters = 20'000'000;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const int threads = omp_get_max_threads();
    const auto t0 = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
      __m512 acc[kAcc];
      for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_set1_ps(static_cast<float>(a) * 1e-3f);
      const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
      for (int64_t i = 0; i < kIters; ++i)
#pragma GCC unroll 12
        for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_fmadd_ps(acc[a], m, c);
      float lanes[16];
      for (int a = 1; a < kAcc; ++a) acc[0] = _mm512_add_ps(acc[0], acc[a]);
      _mm512_storeu_ps(lanes, acc[0]);
      sink += lanes[0];
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sink == 12345.0f) std::printf(" ");  // keeps the loop
    best = std::max(best, threads * static_cast<double>(kIters) * kAcc * 32 / s / 1e9);
  }
  return best;
#else
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vision_bench MODEL_DIR [TOKENS,...] [REPS] [JSON_OUT]\n");
    return 2;
  }
  std::vector<int64_t> token_counts;
  std::stringstream list(argc > 2 ? argv[2] : "256,1024,4096");
  for (std::string item; std::getline(list, item, ',');) token_counts.push_back(std::atoll(item.c_str()));
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  auto engine = kestrel::Engine::load(argv[1]);
  if (!engine) {
    std::fprintf(stderr, "vision_bench: %s\n", engine.error().message().c_str());
    return 1;
  }
  if (!(*engine)->has_vision()) {
    std::fprintf(stderr, "vision_bench: %s has no vision tower\n", argv[1]);
    return 1;
  }
  auto v = kestrel::parse_vision_config((*engine)->config().vision_config_json, argv[1]);
  if (!v) {
    std::fprintf(stderr, "vision_bench: %s\n", v.error().message().c_str());
    return 1;
  }
  std::printf("tower: %d blocks, width %d, q/k/v %d, MLP %d; %d threads\n", v->num_layers, v->hidden, v->qkv_hidden,
              v->intermediate, omp_get_max_threads());
  std::printf("%8s %8s %10s %10s %10s %10s %9s %9s %7s\n", "tokens", "patches", "GFLOP", "best ms", "median ms",
              "worst ms", "GFLOP/s", "peak", "% peak");
  nlohmann::json out = {{"bench", "vision_bench"},
                        {"tower", {{"blocks", v->num_layers}, {"hidden", v->hidden}, {"qkv_hidden", v->qkv_hidden},
                                   {"intermediate", v->intermediate}, {"heads", v->num_heads}}},
                        {"threads", omp_get_max_threads()},
                        {"rows", nlohmann::json::array()}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t tokens : token_counts) {
    int64_t side = 1;
    while (side * side < tokens) ++side;
    if (side * side != tokens) {
      std::fprintf(stderr, "vision_bench: %lld tokens is not a square grid\n", static_cast<long long>(tokens));
      return 2;
    }
    const int64_t gh = side * v->merge_h, gw = side * v->merge_w, n = gh * gw;
    std::vector<float> pixels(static_cast<size_t>(n * 3 * v->patch_size * v->patch_size));
    for (float& x : pixels) x = u(rng);
    const kestrel::VisionImage im{pixels.data(), {1, gh, gw}};
    std::vector<double> ms;
    const double peak = fma_peak_gflops();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto rows = (*engine)->encode_images(std::span<const kestrel::VisionImage>(&im, 1));
      const auto t1 = std::chrono::steady_clock::now();
      if (!rows) {
        std::fprintf(stderr, "vision_bench: %s\n", rows.error().message().c_str());
        return 1;
      }
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double gflop = tower_flops(*v, n) / 1e9, rate = gflop / (ms.front() / 1e3);
    std::printf("%8lld %8lld %10.1f %10.1f %10.1f %10.1f %9.1f %9.1f %6.1f%%\n", static_cast<long long>(tokens),
                static_cast<long long>(n), gflop, ms.front(), ms[ms.size() / 2], ms.back(), rate, peak,
                peak > 0 ? 100 * rate / peak : 0.0);
    std::fflush(stdout);
    out["rows"].push_back({{"image_tokens", tokens}, {"patches", n}, {"gflop", gflop}, {"ms", ms},
                           {"best_ms", ms.front()}, {"gflops_best", rate}, {"fp32_fma_peak_gflops", peak},
                           {"percent_of_peak", peak > 0 ? 100 * rate / peak : 0.0}});
  }
  if (argc > 4) std::ofstream(argv[4]) << out.dump(2) << "\n";
  return 0;
}
