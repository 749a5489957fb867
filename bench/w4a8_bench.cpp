// Int8-activation GEMV/GEMM microbenchmark (google-benchmark): W4A8 (int4, group 32) and MXFP4 × int8
// at decode (T = 1, 8) and prefill (T = 128, 512) shapes, on every ISA path this CPU supports (the
// AVX-512 VNNI one takes its GEMM form from 16 tokens); the AVX-512 VNNI small-T kernel against its
// prefill GEMM form on one thread (BM_Int8Form); GGUF Q4_0 / Q8_0 / MXFP4 × Q8_0 activations on the
// small-T kernel, the prefill GEMM form and, for the packed Q4_0 / MXFP4 rows, the AVX-512 kernel and its AMX
// tile form (BM_GgufInt8; BM_AmxPeak measures the tile unit's tdpbssd peak).
// Rates are per CPU second of the benchmark thread (google-benchmark's CPU time), so run it with
// OMP_NUM_THREADS=1 on a shared machine: wall-clock rates of a 2-thread OpenMP call on an
// oversubscribed box measure the scheduler's timeslices, not the kernel. Reported per run:
//   TOPS       int8 ops/s (2 · out · in · T per call, the int MACs the kernel performs) ÷ 1e12
//   vnni_peak  TOPS as a fraction of the measured vpdpbusd-zmm peak on the same threads
//   GBps       weight bytes read per second (packed + scales) ÷ 1e9 (the decode roofline input)
// The peak is measured first (printed as BM_VnniPeak): OMP threads × 12 independent vpdpbusd zmm
// chains (each instruction 64 u8×s8 MACs = 128 ops), per thread CPU time. Activation quantization is included in the
// timed call (it is part of the kernel's cost in the model).
//   OMP_NUM_THREADS=1 build/release/bench/w4a8_bench [--benchmark_filter=...] [--benchmark_min_time=0.3]
// GCC 12 false positive inside its AVX-512 headers (GCC PR105593), as in w4a8_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <ctime>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "kernels/cpu/w4a8_isa.h"

namespace {

using namespace kestrel::kernels;

__attribute__((target("avx512f,avx512vnni"))) double vnni_chains(int64_t iters) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  return static_cast<double>(_mm512_reduce_add_epi32(s));
}

// AVX2 has no vpdpbusd: an int8 dot product takes vpmaddubsw (32 u8×s8 products summed in pairs to s16),
// vpmaddwd against ones (to s32) and vpaddd, the sequence the AVX2 kernels use. 12 independent chains; the
// barrier on `a` keeps the compiler from hoisting the loop-invariant products. 64 ops per triple.
__attribute__((target("avx2"))) double avx2_int8_chains(int64_t iters) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  __m256i a = _mm256_set1_epi8(3);
  const __m256i b = _mm256_set1_epi8(-5), ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile("" : "+x"(a));
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
  }
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  double sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}

// AMX-INT8: 4 independent tdpbssd chains on full tiles (C 16 × 16 int32, A 16 × 64 s8, B 16 × 64 s8: 16·16·64
// MACs = 32768 ops each). Our own asm, as amx_tiles.h does (no GCC tile intrinsics).
struct alignas(64) AmxPeakConfig {
  uint8_t palette = 1, start = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16};
};
__attribute__((target("amx-tile,amx-int8"))) double amx_chains(int64_t iters) {
  static const AmxPeakConfig cfg;
  alignas(64) static const int8_t ab[16 * 64] = {};
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5" ::"r"(ab), "r"(int64_t{64}) : "memory");
  __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory");
  for (int64_t it = 0; it < iters; ++it)
    __asm__ volatile(
        "tdpbssd %%tmm5, %%tmm4, %%tmm0\n\ttdpbssd %%tmm5, %%tmm4, %%tmm1\n\t"
        "tdpbssd %%tmm5, %%tmm4, %%tmm2\n\ttdpbssd %%tmm5, %%tmm4, %%tmm3" ::: "memory");
  alignas(64) int32_t c[16][16];
  __asm__ volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(c), "r"(int64_t{64}) : "memory");
  __asm__ volatile("tilerelease" ::: "memory");
  return static_cast<double>(c[0][0]);
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best of 3 rates of `chains(iters)` (ops_per_iter int8 ops each iteration), per CPU-second summed over the
// OMP threads (each thread's own CPU time, so a shared, oversubscribed machine does not deflate it).
double chains_rate(double (*chains)(int64_t), double ops_per_iter, int64_t iters = 20'000'000) {
  double sink = 0, best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double rate = 0;
#pragma omp parallel reduction(+ : sink, rate)
    {
      const double t0 = thread_cpu_seconds();
      sink += chains(iters);
      rate += static_cast<double>(iters) * ops_per_iter / (thread_cpu_seconds() - t0);
    }
    best = std::max(best, rate);
  }
  benchmark::DoNotOptimize(sink);
  return best;
}

// int8 ops per CPU-second of vpdpbusd zmm (12 chains × 128 ops per iteration).
double vnni_peak_ops() {
  static const double peak = isa_supported(Isa::kAvx512Vnni) ? chains_rate(vnni_chains, 12 * 128) : 0.0;
  return peak;
}

// The int8 dot-product peak of this CPU's best int8 form: vpdpbusd zmm (AVX-512 VNNI, isa = 512), else the
// AVX2 triple above (isa = 2; 12 chains × 64 ops per iteration).
double int8_peak_ops(int* isa) {
  if (isa_supported(Isa::kAvx512Vnni)) {
    *isa = 512;
    return vnni_peak_ops();
  }
  *isa = 2;
  return isa_supported(Isa::kAvx2) ? chains_rate(avx2_int8_chains, 12 * 64) : 0.0;
}

void BM_Int8Peak(benchmark::State& state) {
  int isa = 0;
  const double p = int8_peak_ops(&isa);
  for (auto _ : state) benchmark::DoNotOptimize(p);
  state.counters["TOPS"] = p * 1e-12;
  state.counters["isa"] = isa;  // 512: vpdpbusd zmm; 2: AVX2 vpmaddubsw + vpmaddwd + vpaddd
  state.counters["threads"] = omp_get_max_threads();
}

// int8 ops per CPU-second of the AMX tile unit (4 chains × 4 × 32768 ops per iteration; fewer iterations:
// each instruction is 16 × 16 × 64 MACs).
double amx_peak_ops() {
  static const double peak = isa_supported(Isa::kAmx) ? chains_rate(amx_chains, 4.0 * 32768, 1'000'000) : 0.0;
  return peak;
}

void BM_AmxPeak(benchmark::State& state) {
  if (!isa_supported(Isa::kAmx)) return state.SkipWithError("unsupported: no AMX");
  const double p = amx_peak_ops();
  for (auto _ : state) benchmark::DoNotOptimize(p);
  state.counters["TOPS"] = p * 1e-12;
  state.counters["threads"] = omp_get_max_threads();
}

void BM_VnniPeak(benchmark::State& state) {
  const double p = vnni_peak_ops();
  for (auto _ : state) benchmark::DoNotOptimize(p);
  state.counters["TOPS"] = p * 1e-12;
  state.counters["threads"] = omp_get_max_threads();
}

struct Weights {
  std::vector<uint8_t> packed, scales;
  WeightMatrix w;
};

Weights make_weights(WeightFormat f, int64_t out, int64_t in) {
  std::mt19937 rng(1);
  Weights m;
  m.packed.resize(static_cast<size_t>(out * in / 2));
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng());
  m.w.format = f, m.w.out = out, m.w.in = in;
  if (f == WeightFormat::kW4A8) {
    m.w.group = 32;
    m.scales.resize(static_cast<size_t>(out * in / 32 * 2));
    for (size_t i = 0; i < m.scales.size(); i += 2) m.scales[i] = 0, m.scales[i + 1] = 0x3c;  // bf16 ≈ 0.0078
  } else {
    m.scales.resize(static_cast<size_t>(out * in / 32));
    for (auto& s : m.scales) s = static_cast<uint8_t>(118 + rng() % 4);
  }
  m.w.data = m.packed.data(), m.w.scales = m.scales.data();
  return m;
}

// Args: format (0 W4A8, 1 MXFP4), isa, out, in, T.
void BM_Int8Matmul(benchmark::State& state) {
  const auto f = state.range(0) == 0 ? WeightFormat::kW4A8 : WeightFormat::kMxfp4;
  // range(1): an Isa through the dispatcher (AMX machines: the VNNI kernels), or kTiles: the AMX tile kernel.
  constexpr int64_t kTiles = 4;
  const bool tiles = state.range(1) == kTiles;
  const auto isa = tiles ? Isa::kAmx : static_cast<Isa>(state.range(1));
  if (!isa_supported(isa)) return state.SkipWithError(("unsupported: " + isa_unsupported_reason(isa)).c_str());
  const int64_t out = state.range(2), in = state.range(3), T = state.range(4);
  Weights m = make_weights(f, out, in);
  std::mt19937 rng(2);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  for (auto& v : x) v = d(rng);
  QuantizedActs acts;
  for (auto _ : state) {
    if (tiles) {
      quantize_activations(x.data(), T, in, acts);
      int8_matmul_amx_tiles(m.w, acts, y.data());
    } else {
      int8_matmul(m.w, x.data(), T, y.data(), isa);
    }
    benchmark::ClobberMemory();
  }
  const double ops = 2.0 * static_cast<double>(out * in * T);
  const double bytes = static_cast<double>(m.packed.size() + m.scales.size());
  const double n = static_cast<double>(state.iterations());
  state.counters["TOPS"] = benchmark::Counter(ops * n * 1e-12, benchmark::Counter::kIsRate);
  state.counters["GBps"] = benchmark::Counter(bytes * n * 1e-9, benchmark::Counter::kIsRate);
  if (vnni_peak_ops() > 0)
    state.counters["vnni_peak"] = benchmark::Counter(ops * n / vnni_peak_ops(), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(f == WeightFormat::kW4A8 ? "w4a8" : "mxfp4") + "/" + (tiles ? "amx-tiles" : isa_name(isa)));
}

void shapes(benchmark::internal::Benchmark* b) {
  // (out, in): a k3-bench projection (2048×2048), its expert (1024×1024), a 7168-wide projection.
  const std::vector<std::pair<int64_t, int64_t>> mats = {{2048, 2048}, {1024, 1024}, {4096, 7168}};
  for (int fmt : {0, 1})
    for (int64_t isa : {0, 1, 2, 3, 4})  // scalar, avx2, avx512vnni, amx (dispatcher), the AMX tile kernel
      for (auto [o, i] : mats)
        for (int64_t T : {1, 8, 128, 512}) {
          if (isa == 0 && T > 8) continue;  // the reference path: decode shapes only
          if (o == 4096 && T == 512) continue;
          b->Args({fmt, isa, o, i, T});
        }
}

// W4A8 / MXFP4 × int8 on AVX-512 VNNI, one thread, quantization included. Args: format (0 W4A8
// group 32, 1 MXFP4), form (0 small-T kernel, 1 prefill GEMM), out, in, T.
void BM_Int8Form(benchmark::State& state) {
  if (!isa_supported(Isa::kAvx512Vnni)) return state.SkipWithError("unsupported: no AVX-512 VNNI");
  const auto f = state.range(0) == 0 ? WeightFormat::kW4A8 : WeightFormat::kMxfp4;
  const bool gemm = state.range(1) == 1;
  const int64_t out = state.range(2), in = state.range(3), T = state.range(4);
  Weights m = make_weights(f, out, in);
  std::mt19937 rng(2);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  for (auto& v : x) v = d(rng);
  QuantizedActs a;
  for (auto _ : state) {
    quantize_activations(x.data(), T, in, a);
    int8_matmul_quantized(m.w, a, y.data(), Isa::kAvx512Vnni, gemm ? Int8Form::kGemm : Int8Form::kSmallT);
    benchmark::ClobberMemory();
  }
  const double ops = 2.0 * static_cast<double>(out * in * T), n = static_cast<double>(state.iterations());
  state.counters["TOPS"] = benchmark::Counter(ops * n * 1e-12, benchmark::Counter::kIsRate);
  if (vnni_peak_ops() > 0)
    state.counters["vnni_peak"] = benchmark::Counter(ops * n / vnni_peak_ops(), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(f == WeightFormat::kW4A8 ? "w4a8" : "mxfp4") + (gemm ? "/gemm" : "/small-T"));
}

void form_shapes(benchmark::internal::Benchmark* b) {
  // (out, in): k3-bench projection, its expert, a 7168-wide projection.
  const std::vector<std::pair<int64_t, int64_t>> mats = {{2048, 2048}, {1024, 1024}, {4096, 7168}};
  for (int fmt : {0, 1})
    for (auto [o, i] : mats)
      for (int64_t T : {16, 32, 128, 512})
        for (int form : {0, 1}) b->Args({fmt, form, o, i, T});
}

// GGUF Q4_0 / Q8_0 / MXFP4 × Q8_0 activations (gguf_int8.h), one thread, quantization included. Args:
// format (0 Q4_0, 1 Q8_0, 2 MXFP4), path (Q8_0 / MXFP4 in place: 0 small-T kernel gguf_int8_rows_avx512, 1
// prefill GEMM gguf_int8_gemm_rows; Q4_0 / MXFP4: 2 the packed kernel q4_x16_rows_avx512, Q4_0's only int8
// kernel and what MXFP4 matrices loaded from a file run on), out, in, T.
void BM_GgufInt8(benchmark::State& state) {
  if (!isa_supported(Isa::kAvx512Vnni)) return state.SkipWithError("unsupported: no AVX-512 VNNI");
  const auto f = state.range(0) == 0 ? WeightFormat::kGgufQ4_0 : state.range(0) == 1 ? WeightFormat::kGgufQ8_0 : WeightFormat::kGgufMxfp4;
  const bool gemm = state.range(1) == 1, packed = state.range(1) >= 2, amx = state.range(1) == 3;
  if (amx && !isa_supported(Isa::kAmx)) return state.SkipWithError("unsupported: no AMX");
  if ((f == WeightFormat::kGgufQ4_0 && !packed) || (f == WeightFormat::kGgufQ8_0 && packed))
    return state.SkipWithError("Q4_0 runs on path 2 (the packed kernel) only, Q8_0 on paths 0 and 1");
  const int64_t out = state.range(2), in = state.range(3), T = state.range(4), bb = gguf_block_bytes(f);
  std::mt19937 rng(1);
  std::vector<uint8_t> data(static_cast<size_t>(out * in / 32 * bb));
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < data.size(); b += static_cast<size_t>(bb)) {
    if (f == WeightFormat::kGgufMxfp4) data[b] = static_cast<uint8_t>(118 + rng() % 4);  // E8M0 ≈ 2^-9
    else data[b + 1] = static_cast<uint8_t>(0x1c + rng() % 4);                          // fp16 ≈ 2^-8
  }
  WeightMatrix w;
  w.format = f, w.out = out, w.in = in, w.data = data.data();
  kestrel::AlignedVector<uint8_t> rows16;
  if (packed) rows16 = f == WeightFormat::kGgufQ4_0 ? pack_q4_0_x16(w) : pack_mxfp4_x16(w), w.packed = rows16.data();
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  for (auto& v : x) v = d(rng);
  Q8Acts a;
  for (auto _ : state) {
    q8_acts_prepare(a, T, in, packed, gemm && f == WeightFormat::kGgufQ8_0, gemm && f == WeightFormat::kGgufMxfp4);
    q8_acts_fill(x.data(), 0, T, a);
    if (amx) q4_x16_rows_amx(w, a, nullptr, T, y.data(), out, 0, out);
    else if (packed) q4_x16_rows_avx512(w, a, nullptr, T, y.data(), out, 0, out);
    else if (gemm) gguf_int8_gemm_rows(w, a, y.data(), out, 0, out);
    else gguf_int8_rows_avx512(w, a, y.data(), out, 0, out);
    benchmark::ClobberMemory();
  }
  const double ops = 2.0 * static_cast<double>(out * in * T), n = static_cast<double>(state.iterations());
  state.counters["TOPS"] = benchmark::Counter(ops * n * 1e-12, benchmark::Counter::kIsRate);
  if (vnni_peak_ops() > 0)
    state.counters["vnni_peak"] = benchmark::Counter(ops * n / vnni_peak_ops(), benchmark::Counter::kIsRate);
  if (amx && amx_peak_ops() > 0)
    state.counters["amx_peak"] = benchmark::Counter(ops * n / amx_peak_ops(), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(f == WeightFormat::kGgufQ4_0 ? "q4_0" : f == WeightFormat::kGgufQ8_0 ? "q8_0" : "mxfp4") +
                 (amx ? "/packed-amx" : packed ? "/packed" : gemm ? "/gemm" : "/small-T"));
}

void gguf_shapes(benchmark::internal::Benchmark* b) {
  // (out, in): k3-bench attention / FFN up / FFN down; kimi-linear-bench FFN up / down.
  const std::vector<std::pair<int64_t, int64_t>> mats = {{2048, 2048}, {8192, 2048}, {2048, 8192}, {9216, 2304}, {2304, 9216}};
  for (int fmt : {0, 1, 2})
    for (auto [o, i] : mats)
      for (int64_t T : {8, 16, 32, 128, 512})
        for (int path : {0, 1, 2, 3})
          if ((path >= 2) == (fmt == 0) || (path == 3 && fmt == 2)) b->Args({fmt, path, o, i, T});  // Q4_0: packed only
  // gpt-oss-20b's expert width (2880 × 2880): MXFP4 in place (small-T, GEMM) against its packed rows, decode
  // (T = 1, 4: routed experts see few tokens) to prefill.
  for (int64_t T : {1, 4, 64, 512})
    for (int path : {0, 1, 2, 3}) b->Args({2, path, 2880, 2880, T});
}

}  // namespace

BENCHMARK(BM_VnniPeak)->Iterations(1);
BENCHMARK(BM_AmxPeak)->Iterations(1);
BENCHMARK(BM_Int8Peak)->Iterations(1);
BENCHMARK(BM_Int8Matmul)->Apply(shapes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Int8Form)->Apply(form_shapes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GgufInt8)->Apply(gguf_shapes)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
