// KDA core kernels (src/kernels/cpu/kda.h) against goldens from the independent reference fla-core
// (tools/gen_kda_goldens.py: fla naive_recurrent_kda / naive_chunk_kda, fp32), plus self-consistency
// tests (split prefill/decode continuation with asymmetric states, K != V, fp64 definition check).
//
// Tolerance: both sides are fp32 and compute the same function in a different association order
// (chunked WY/UT form with forward substitution vs token recurrence; blocked dots vs einsum). The
// delta-rule step (I − β k kᵀ) diag(exp g) is non-expansive for ‖k‖ = 1, β ∈ (0, 1], so rounding errors
// do not grow with T; expected errors are a few fp32 ulps of the value scale. We assert
//   max|ours − ref| <= 2e-5 · max(max|ref|, floor)
// i.e. 2e-5 relative to the tensor's scale; floor = 0.1 for outputs (o = Sᵀ q·128^-0.5 with O(1) state
// entries, so 0.1 is the natural absolute scale even when a case's outputs are smaller) and 1 for states.
// Measured (gcc 12, AVX-512): outputs <= 4.2e-6 relative to max|out| (extreme gate, chunk 128), <= 8e-7
// for ordinary gates; states <= 5.7e-6. Real bugs (decay order, transposed state, tail handling,
// diagonal of Aqk) give errors of 1e-2..1 relative and all fail (checked by mutating the kernel).
// Measured maxima are printed per case and path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kda.h"
#include "loader/safetensors.h"

namespace kestrel {
namespace {

using kernels::KdaArgs;

constexpr double kRelTol = 2e-5;

struct Golden {
  int64_t T = 0, H = 0, K = 0, V = 0;
  float scale = 0.0f;
  std::vector<float> q, k, v, g, beta, state0, out, state_final, out_chunk;
};

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name, bool required = true) {
  for (const auto& e : f.header().entries) {
    if (e.name == name) {
      TensorView tv = f.view(e);
      EXPECT_EQ(tv.dtype, DType::kF32) << name;
      const float* p = tv.as<float>();
      return std::vector<float>(p, p + tv.numel());
    }
  }
  if (required) ADD_FAILURE() << "missing tensor " << name << " in " << f.path();
  return {};
}

Golden load_golden(const std::string& case_name) {
  const std::string path = std::string(KESTREL_TEST_DATA) + "/kda/" + case_name + ".safetensors";
  auto file = SafetensorsFile::open(path);
  Golden g;
  if (!file) {
    ADD_FAILURE() << "cannot open " << path << ": " << file.error().message();
    return g;
  }
  for (const auto& e : file->header().entries) {
    if (e.name == "v") {
      g.T = e.shape.at(0);
      g.H = e.shape.at(1);
      g.V = e.shape.at(2);
    } else if (e.name == "q") {
      g.K = e.shape.at(2);
    }
  }
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.K)));
  auto it = file->header().metadata.find("scale");
  if (it != file->header().metadata.end()) g.scale = std::stof(it->second);
  g.q = read_f32(*file, "q");
  g.k = read_f32(*file, "k");
  g.v = read_f32(*file, "v");
  g.g = read_f32(*file, "g");
  g.beta = read_f32(*file, "beta");
  g.state0 = read_f32(*file, "state0");
  g.out = read_f32(*file, "out");
  g.state_final = read_f32(*file, "state_final");
  g.out_chunk = read_f32(*file, "out_chunk", /*required=*/false);
  EXPECT_EQ(static_cast<int64_t>(g.q.size()), g.T * g.H * g.K);
  EXPECT_EQ(static_cast<int64_t>(g.state0.size()), g.H * g.K * g.V);
  return g;
}

// Inputs for one sequence; `run` processes tokens [t0, t0 + n) with the given state.
struct Seq {
  int64_t T, H, K, V;
  float scale;
  const float *q, *k, *v, *g, *beta;
  KdaArgs args(int64_t t0, int64_t n, float* state, float* out) const {
    KdaArgs a;
    a.T = n;
    a.H = H;
    a.K = K;
    a.V = V;
    a.q = q + t0 * H * K;
    a.k = k + t0 * H * K;
    a.v = v + t0 * H * V;
    a.g = g + t0 * H * K;
    a.beta = beta + t0 * H;
    a.scale = scale;
    a.state = state;
    a.out = out + t0 * H * V;
    return a;
  }
};

Seq seq_of(const Golden& g) {
  return Seq{g.T, g.H, g.K, g.V, g.scale, g.q.data(), g.k.data(), g.v.data(), g.g.data(), g.beta.data()};
}

double max_abs(const float* a, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i])));
  return m;
}

double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// Asserts max|got − ref| <= kRelTol · max(max|ref|, floor) and returns the relative error.
double expect_close(const float* got, const float* ref, int64_t n, const std::string& what, double floor = 0.1) {
  const double scale = std::max(max_abs(ref, n), floor);
  const double err = max_diff(got, ref, n);
  EXPECT_LE(err, kRelTol * scale) << what << ": max abs err " << err << " (scale " << scale << ")";
  return err / scale;
}

enum class Path { kRecurrent, kChunked };

// Runs prefix [0, L) in one call; returns out [L,H,V] and the final state in `state`.
std::vector<float> run(const Seq& s, int64_t L, Path p, int64_t chunk, std::vector<float>& state) {
  std::vector<float> out(static_cast<size_t>(L * s.H * s.V), NAN);
  KdaArgs a = s.args(0, L, state.data(), out.data());
  if (p == Path::kRecurrent) {
    kernels::kda_recurrent(a);
  } else {
    kernels::kda_chunked(a, chunk);
  }
  return out;
}

class KdaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(KdaGolden, MatchesFlaReference) {
  const Golden g = load_golden(GetParam());
  ASSERT_GT(g.T, 0);
  const Seq s = seq_of(g);
  const int64_t HKV = g.H * g.K * g.V;
  const std::vector<int64_t> prefixes = {1, 2, 7, 16, 63, 64, 65, 127, 128, 129, 200, 256, 300};
  struct Variant {
    Path p;
    int64_t chunk;
    const char* name;
  };
  const std::vector<Variant> variants = {{Path::kRecurrent, 0, "recurrent"}, {Path::kChunked, 64, "chunk64"},
                                         {Path::kChunked, 16, "chunk16"},    {Path::kChunked, 7, "chunk7"},
                                         {Path::kChunked, 1, "chunk1"},      {Path::kChunked, 128, "chunk128"}};
  for (const Variant& var : variants) {
    double worst_out = 0.0, worst_state = 0.0;
    for (int64_t L : prefixes) {
      if (L > g.T) continue;
      std::vector<float> st = g.state0;
      std::vector<float> out = run(s, L, var.p, var.chunk, st);
      const std::string what = GetParam() + "/" + var.name + "/L=" + std::to_string(L);
      // Causal: the reference outputs of the full sequence are the reference for every prefix.
      worst_out = std::max(worst_out, expect_close(out.data(), g.out.data(), L * g.H * g.V, what + "/out"));
      if (L == g.T) {
        worst_state = std::max(
            worst_state, expect_close(st.data(), g.state_final.data(), HKV, what + "/state", 1.0));
      } else {
        // No stored reference state at this prefix: compare with our recurrent path, which is
        // checked against fla at L == T above and whose outputs match fla at every prefix.
        std::vector<float> st_ref = g.state0;
        (void)run(s, L, Path::kRecurrent, 0, st_ref);
        worst_state = std::max(worst_state, expect_close(st.data(), st_ref.data(), HKV, what + "/state*", 1.0));
      }
    }
    std::printf("[ kda ] %-10s %-9s max rel err: out %.2e  state %.2e\n", GetParam().c_str(), var.name,
                worst_out, worst_state);
  }
  if (!g.out_chunk.empty()) {
    // fla naive_chunk_kda (chunk 64) output on the first 64*floor(T/64) tokens.
    const int64_t Lc = static_cast<int64_t>(g.out_chunk.size()) / (g.H * g.V);
    std::vector<float> st = g.state0;
    std::vector<float> out = run(s, Lc, Path::kChunked, 64, st);
    const double e = expect_close(out.data(), g.out_chunk.data(), Lc * g.H * g.V, GetParam() + "/vs naive_chunk");
    std::printf("[ kda ] %-10s chunk64 vs fla naive_chunk_kda (L=%lld): max rel err %.2e\n", GetParam().c_str(),
                static_cast<long long>(Lc), e);
  }
}

INSTANTIATE_TEST_SUITE_P(Fla, KdaGolden, ::testing::Values("softplus", "lowerbound", "extreme"),
                         [](const auto& info) { return info.param; });

// Random inputs: l2-normalised q/k, gates with a spread of decay strengths (some channels ~0,
// some strongly negative), β in (0,1), v ~ N(0,1).
struct RandomSeq {
  int64_t T, H, K, V;
  std::vector<float> q, k, v, g, beta;
  RandomSeq(int64_t T_, int64_t H_, int64_t K_, int64_t V_, uint32_t seed, float gate_mag = 2.0f)
      : T(T_), H(H_), K(K_), V(V_), q(T * H * K), k(T * H * K), v(T * H * V), g(T * H * K), beta(T * H) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    auto l2 = [&](std::vector<float>& x) {
      for (int64_t i = 0; i < T * H; ++i) {
        double ss = 0.0;
        for (int64_t d = 0; d < K; ++d) {
          x[i * K + d] = nd(rng);
          ss += static_cast<double>(x[i * K + d]) * x[i * K + d];
        }
        const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
        for (int64_t d = 0; d < K; ++d) x[i * K + d] *= inv;
      }
    };
    l2(q);
    l2(k);
    for (auto& x : v) x = nd(rng);
    std::vector<float> chan(static_cast<size_t>(H * K));
    for (auto& c : chan) c = gate_mag * ud(rng) * ud(rng);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * K; ++i) g[t * H * K + i] = -chan[i] * (0.5f + ud(rng));
    for (auto& b : beta) b = 1.0f / (1.0f + std::exp(-nd(rng)));
  }
  Seq seq() const {
    return Seq{T, H, K, V, static_cast<float>(1.0 / std::sqrt(static_cast<double>(K))),
               q.data(), k.data(), v.data(), g.data(), beta.data()};
  }
};

// Asymmetric random state [H,K,V]: S[k][v] and S[v][k] are unrelated (a layout bug must fail).
std::vector<float> random_state(int64_t H, int64_t K, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(H * K * V));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) s[(h * K + i) * V + j] = nd(rng) + (i < j ? 1.5f : -0.75f) + 0.01f * i;
  return s;
}

// Prefill part 1 chunked, continue token by token with the recurrent kernel, then chunked again:
// must equal the one-shot chunked (and recurrent) result.
TEST(Kda, SplitPrefillDecodeContinuation) {
  const int64_t T = 200, H = 3, K = 128, V = 128;
  const RandomSeq r(T, H, K, V, 7);
  const Seq s = r.seq();
  const std::vector<float> s0 = random_state(H, K, V, 11);

  std::vector<float> st_once = s0;
  const std::vector<float> out_once = run(s, T, Path::kChunked, 64, st_once);
  std::vector<float> st_rec = s0;
  const std::vector<float> out_rec = run(s, T, Path::kRecurrent, 0, st_rec);
  expect_close(out_once.data(), out_rec.data(), T * H * V, "one-shot chunked vs recurrent out");
  expect_close(st_once.data(), st_rec.data(), H * K * V, "one-shot chunked vs recurrent state", 1.0);

  const std::vector<std::pair<int64_t, int64_t>> splits = {{1, 2}, {37, 45}, {64, 65}, {63, 130}, {100, 199}, {0, 3}};
  for (auto [a, b] : splits) {
    std::vector<float> st = s0;
    std::vector<float> out(static_cast<size_t>(T * H * V), NAN);
    if (a > 0) kernels::kda_chunked(s.args(0, a, st.data(), out.data()), 64);
    for (int64_t t = a; t < b; ++t) kernels::kda_recurrent(s.args(t, 1, st.data(), out.data()));
    kernels::kda_chunked(s.args(b, T - b, st.data(), out.data()), 64);
    const std::string what = "split " + std::to_string(a) + "/" + std::to_string(b);
    expect_close(out.data(), out_once.data(), T * H * V, what + " out");
    expect_close(st.data(), st_once.data(), H * K * V, what + " state", 1.0);
  }
}

// The state is key-major [H,K,V]: transposing the initial state must change the result (guards
// against a test that would pass for a symmetric state), and K != V must work in both kernels.
TEST(Kda, NonSquareHeadsAndLayout) {
  const int64_t T = 90, H = 2, K = 32, V = 48;
  const RandomSeq r(T, H, K, V, 3);
  const Seq s = r.seq();
  const std::vector<float> s0 = random_state(H, K, V, 5);
  std::vector<float> st_rec = s0;
  const std::vector<float> out_rec = run(s, T, Path::kRecurrent, 0, st_rec);
  for (int64_t chunk : {64, 16, 5}) {
    std::vector<float> st = s0;
    const std::vector<float> out = run(s, T, Path::kChunked, chunk, st);
    expect_close(out.data(), out_rec.data(), T * H * V, "K!=V chunk " + std::to_string(chunk) + " out");
    expect_close(st.data(), st_rec.data(), H * K * V, "K!=V chunk " + std::to_string(chunk) + " state", 1.0);
  }
}

// fp64 transcription of the definition (kda.h / docs/model-math.md §3.5) on a small K != V case.
TEST(Kda, RecurrentMatchesFp64Definition) {
  const int64_t T = 20, H = 2, K = 8, V = 12;
  const RandomSeq r(T, H, K, V, 9, 4.0f);
  const Seq s = r.seq();
  const std::vector<float> s0 = random_state(H, K, V, 13);
  std::vector<double> S(s0.begin(), s0.end()), o(static_cast<size_t>(T * H * V));
  for (int64_t h = 0; h < H; ++h) {
    double* Sh = S.data() + h * K * V;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t b = t * H + h;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) Sh[i * V + j] *= std::exp(static_cast<double>(r.g[b * K + i]));
      for (int64_t j = 0; j < V; ++j) {
        double p = 0.0;
        for (int64_t i = 0; i < K; ++i) p += Sh[i * V + j] * r.k[b * K + i];
        const double u = r.beta[b] * (r.v[b * V + j] - p);
        for (int64_t i = 0; i < K; ++i) Sh[i * V + j] += r.k[b * K + i] * u;
      }
      for (int64_t j = 0; j < V; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < K; ++i) acc += Sh[i * V + j] * (r.q[b * K + i] * static_cast<double>(s.scale));
        o[b * V + j] = acc;
      }
    }
  }
  std::vector<float> of(o.begin(), o.end()), Sf(S.begin(), S.end());
  for (Path p : {Path::kRecurrent, Path::kChunked}) {
    std::vector<float> st = s0;
    const std::vector<float> out = run(s, T, p, 8, st);
    expect_close(out.data(), of.data(), T * H * V, "fp64 definition out");
    expect_close(st.data(), Sf.data(), H * K * V, "fp64 definition state", 1.0);
  }
}

}  // namespace
}  // namespace kestrel
