// Vision encoder benchmark: milliseconds per image through a model's vision tower + projector (Engine::encode_images,
// one image per batch) at square grids of 256 / 1024 / 4096 image tokens, the GFLOP/s that gives against a FLOP
// model of the tower (docs/PERFORMANCE.md "Vision encoder"), as a share of the fp32 FMA peak measured right before
// and right after each size in the same process (measure_peak: both threads at once, 8 trials, max and spread, and
// the effective clock), and the best repetition's time per stage (VisionStageTimes). Pixels are random (the cost
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
#include <tuple>
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

// The machine's fp32 FMA peak, measured on all OpenMP threads at once: every thread runs 12 independent chains of
// FMAs (vfmadd231ps, 2 FLOP per lane; two FMA ports with a 4-cycle latency need >= 8 chains), written
// in asm so the compiler can neither spill nor fold them, the threads started together behind a barrier. Trials of
// ~0.2 s each; the spread says how steady the cores were.
struct Peak {
  std::vector<double> gflops;  // per trial, sorted
  double clock_ghz = 0;        // effective clock during the trials (a dependent FMA chain, see clock_ghz)
  double max() const { return gflops.empty() ? 0 : gflops.back(); }
  double min() const { return gflops.empty() ? 0 : gflops.front(); }
  double median() const { return gflops.empty() ? 0 : gflops[gflops.size() / 2]; }
};

// The widest FMA the build targets: zmm (16 fp32 lanes) with AVX-512, else ymm (8 lanes) with AVX2 + FMA (AMD Zen
// 1–3, Intel Haswell and later without AVX-512: two FMA pipes too, 4-cycle latency on Zen 2/3 and Skylake).
#if defined(__AVX512F__)
#define KESTREL_PEAK_REG "zmm"
constexpr int kPeakLanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
#define KESTREL_PEAK_REG "ymm"
constexpr int kPeakLanes = 8;
#endif

#if defined(KESTREL_PEAK_REG)
constexpr int64_t kFmaChains = 12;
#define KESTREL_FMA(a, b, c) "vfmadd231ps %%" KESTREL_PEAK_REG #a ", %%" KESTREL_PEAK_REG #b ", %%" KESTREL_PEAK_REG #c "\n\t"

void fma_chains(int64_t iters) {
  asm volatile(
      "vxorps %%" KESTREL_PEAK_REG "12, %%" KESTREL_PEAK_REG "12, %%" KESTREL_PEAK_REG "12\n\t"
      "vxorps %%" KESTREL_PEAK_REG "13, %%" KESTREL_PEAK_REG "13, %%" KESTREL_PEAK_REG "13\n\t"
      "1:\n\t"
      KESTREL_FMA(12, 13, 0) KESTREL_FMA(12, 13, 1) KESTREL_FMA(12, 13, 2) KESTREL_FMA(12, 13, 3)
      KESTREL_FMA(12, 13, 4) KESTREL_FMA(12, 13, 5) KESTREL_FMA(12, 13, 6) KESTREL_FMA(12, 13, 7)
      KESTREL_FMA(12, 13, 8) KESTREL_FMA(12, 13, 9) KESTREL_FMA(12, 13, 10) KESTREL_FMA(12, 13, 11)
      "dec %0\n\t"
      "jnz 1b\n\t"
      : "+r"(iters)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "cc");
}

// One chain of 8 dependent FMAs per iteration: 8 × 4 cycles (vfmadd231ps latency on Skylake-SP through Sapphire
// Rapids, on Zen 2/3 (ymm) and on Zen 4), so iterations · 32 / seconds is the core clock.
void fma_dependent(int64_t iters) {
  asm volatile(
      "vxorps %%" KESTREL_PEAK_REG "0, %%" KESTREL_PEAK_REG "0, %%" KESTREL_PEAK_REG "0\n\t"
      "1:\n\t"
      KESTREL_FMA(0, 0, 0) KESTREL_FMA(0, 0, 0) KESTREL_FMA(0, 0, 0) KESTREL_FMA(0, 0, 0)
      KESTREL_FMA(0, 0, 0) KESTREL_FMA(0, 0, 0) KESTREL_FMA(0, 0, 0) KESTREL_FMA(0, 0, 0)
      "dec %0\n\t"
      "jnz 1b\n\t"
      : "+r"(iters)
      :
      : "xmm0", "cc");
}
#undef KESTREL_FMA
constexpr int kPeakLanesOrZero = kPeakLanes;
#else
constexpr int kPeakLanesOrZero = 0;
#endif

// Seconds for every OpenMP thread to run body() at once (started together behind a barrier).
template <class F>
double all_threads(F&& body) {
  std::chrono::steady_clock::time_point t0;
#pragma omp parallel
  {
#pragma omp barrier
#pragma omp master
    t0 = std::chrono::steady_clock::now();
#pragma omp barrier
    body();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Peak measure_peak(int trials) {
  Peak p;
#if defined(KESTREL_PEAK_REG)
  constexpr int64_t kIters = 120'000'000, kClockIters = 25'000'000;
  const int threads = omp_get_max_threads();
  for (int t = 0; t < trials; ++t) {
    const double s = all_threads([] { fma_chains(kIters); });
    p.gflops.push_back(threads * static_cast<double>(kIters) * kFmaChains * kPeakLanes * 2 / s / 1e9);
  }
  std::sort(p.gflops.begin(), p.gflops.end());
  // All threads at once, as during the encoder; best of 3.
  for (int t = 0; t < 3; ++t)
    p.clock_ghz = std::max(p.clock_ghz, static_cast<double>(kClockIters) * 32 / all_threads([] {
                                          fma_dependent(kClockIters);
                                        }) / 1e9);
#else
  (void)trials;  // the peak loop needs AVX-512 or AVX2 + FMA: without them no peak is measured (shares print as 0)
#endif
  return p;
}

nlohmann::json peak_json(const Peak& p) {
  return {{"max_gflops", p.max()}, {"median_gflops", p.median()}, {"min_gflops", p.min()}, {"trials_gflops", p.gflops},
          {"clock_ghz", p.clock_ghz}};
}

constexpr int kPeakTrials = 8;

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
  std::printf("%8s %8s %9s %9s %9s %9s %8s %17s %17s %7s %7s %11s\n", "tokens", "patches", "GFLOP", "best ms",
              "median ms", "worst ms", "GFLOP/s", "peak before", "peak after", "% bef", "% aft", "GHz bef/aft");
  nlohmann::json out = {{"bench", "vision_bench"},
                        {"tower", {{"blocks", v->num_layers}, {"hidden", v->hidden}, {"qkv_hidden", v->qkv_hidden},
                                   {"intermediate", v->intermediate}, {"heads", v->num_heads}}},
                        {"threads", omp_get_max_threads()},
                        {"peak_model",
                         "measured (peak_before / peak_after) with the build's widest FMA (peak_lanes: 16 zmm, 8 "
                         "ymm); theoretical_peak_at_clock_before_gflops assumes threads x clock x 2 FMA per cycle "
                         "x peak_lanes x 2 FLOP (Xeon, Zen 5 with zmm; Zen 2/3 with ymm); "
                         "flop_per_cycle_per_thread_before is what the machine gave (32 where a core issues one "
                         "zmm FMA per cycle, e.g. Zen 4)"},
                        {"peak_lanes", kPeakLanesOrZero},
                        {"rows", nlohmann::json::array()}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int threads = omp_get_max_threads();
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
    kestrel::VisionStageTimes best_stages;
    const Peak before = measure_peak(kPeakTrials);
    for (int r = 0; r < reps; ++r) {
      kestrel::VisionStageTimes stages;
      const auto t0 = std::chrono::steady_clock::now();
      auto rows = (*engine)->encode_images(std::span<const kestrel::VisionImage>(&im, 1), {}, &stages);
      const auto t1 = std::chrono::steady_clock::now();
      if (!rows) {
        std::fprintf(stderr, "vision_bench: %s\n", rows.error().message().c_str());
        return 1;
      }
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (ms.back() <= *std::min_element(ms.begin(), ms.end())) best_stages = stages;
    }
    const Peak after = measure_peak(kPeakTrials);
    std::sort(ms.begin(), ms.end());
    const double gflop = tower_flops(*v, n) / 1e9, rate = gflop / (ms.front() / 1e3);
    const auto pct = [&](const Peak& p) { return p.max() > 0 ? 100 * rate / p.max() : 0.0; };
    // FLOP per cycle per thread of the peak loop: 64 with two zmm FMA units per core, 32 with one (Zen 4) or with two
    // ymm units (Zen 2/3).
    const auto flop_per_cycle = [&](const Peak& p) { return p.clock_ghz > 0 ? p.max() / threads / p.clock_ghz : 0.0; };
    std::printf("%8lld %8lld %9.1f %9.1f %9.1f %9.1f %8.1f %7.1f (%5.1f-) %7.1f (%5.1f-) %6.1f%% %6.1f%% %5.2f/%4.2f\n",
                static_cast<long long>(tokens), static_cast<long long>(n), gflop, ms.front(), ms[ms.size() / 2],
                ms.back(), rate, before.max(), before.min(), after.max(), after.min(), pct(before), pct(after),
                before.clock_ghz, after.clock_ghz);
    // The best repetition per stage: milliseconds, share of the repetition, and GFLOP/s where the FLOP model counts it.
    const double N = static_cast<double>(n), D = v->hidden, Q = v->qkv_hidden, I = v->intermediate,
                 L = v->num_layers;
    const double outside_blocks =
        tower_flops(*v, n) - L * (2 * N * D * 3 * Q + 4 * N * N * Q + 2 * N * Q * D + 4 * N * D * I);
    const double patch_embed = 2 * N * 3 * v->patch_size * v->patch_size * D;
    const std::vector<std::tuple<const char*, double, double>> stage_rows = {
        {"embed", best_stages.embed, patch_embed},
        {"buffers", best_stages.buffers, 0},
        {"norms", best_stages.norms, 0},
        {"qkv", best_stages.qkv, L * 2 * N * D * 3 * Q},
        {"rope", best_stages.rope, 0},
        {"attention", best_stages.attention, L * 4 * N * N * Q},
        {"out_proj", best_stages.out_proj, L * 2 * N * Q * D},
        {"fc0_gelu", best_stages.fc0_gelu, L * 2 * N * D * I},
        {"fc1", best_stages.fc1, L * 2 * N * I * D},
        {"residual", best_stages.residual, 0},
        {"merger", best_stages.merger, 0},
        {"projector", best_stages.projector, outside_blocks - patch_embed}};
    nlohmann::json stages_json = nlohmann::json::object();
    std::printf("         peak loop: %.1f / %.1f FLOP per cycle per thread (before / after)\n", flop_per_cycle(before),
                flop_per_cycle(after));
    std::printf("         stage ms (%% of best, GFLOP/s):");
    for (const auto& [name, sec, flop] : stage_rows) {
      std::printf(" %s %.0f (%.1f%%", name, sec * 1e3, 100 * sec * 1e3 / ms.front());
      if (flop > 0 && sec > 0) std::printf(", %.0f", flop / sec / 1e9);
      std::printf(")");
      stages_json[name] = {{"ms", sec * 1e3}, {"gflops", flop > 0 && sec > 0 ? flop / sec / 1e9 : 0.0}};
    }
    std::printf("\n");
    std::fflush(stdout);
    out["rows"].push_back({{"image_tokens", tokens}, {"patches", n}, {"gflop", gflop}, {"ms", ms},
                           {"best_ms", ms.front()}, {"gflops_best", rate}, {"peak_before", peak_json(before)},
                           {"peak_after", peak_json(after)},
                           {"theoretical_peak_at_clock_before_gflops", threads * before.clock_ghz * 2 * kPeakLanesOrZero * 2},
                           {"flop_per_cycle_per_thread_before", flop_per_cycle(before)},
                           {"percent_of_peak_before", pct(before)}, {"percent_of_peak_after", pct(after)},
                           {"stages_of_best", stages_json}});
  }
  if (argc > 4) std::ofstream(argv[4]) << out.dump(2) << "\n";
  return 0;
}
