// Vision encoder benchmark: milliseconds per image through a model's vision tower + projector (Engine::encode_images,
// one image per batch) at square grids of 256 / 1024 / 4096 image tokens, and the GFLOP/s that gives against a FLOP
// model of the tower (docs/PERFORMANCE.md "Vision encoder"). Pixels are random (the cost does not depend on them).
//
//   vision_bench MODEL_DIR [TOKENS,...] [REPS]      e.g. vision_bench /tmp/vt27 256,1024 2
//
// FLOP model (multiply-add = 2), n patches, tower widths D, q/k/v width Q, MLP width I, L blocks:
//   patch embedding 2·n·(3·p²)·D; per block 2·n·D·3Q (qkv) + 4·n²·Q (scores and values over all heads)
//   + 2·n·Q·D (output) + 4·n·D·I (MLP); projector 2·(n/4)·(its matrix parameters). Norms, RoPE, softmax, GELU and
//   the position-grid interpolation are left out (elementwise, < 1 % here).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vision_bench MODEL_DIR [TOKENS,...] [REPS]\n");
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
  std::printf("%8s %8s %10s %10s %12s %9s\n", "tokens", "patches", "GFLOP", "best ms", "median ms", "GFLOP/s");
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
    const double gflop = tower_flops(*v, n) / 1e9;
    std::printf("%8lld %8lld %10.1f %10.1f %12.1f %9.1f\n", static_cast<long long>(tokens), static_cast<long long>(n),
                gflop, ms.front(), ms[ms.size() / 2], gflop / (ms.front() / 1e3));
  }
  return 0;
}
