// The chunked KDA kernel (kda_chunked.cpp) on head sizes that are not whole vectors (its scratch rows are padded
// with zeros, which must not leak into outputs or state), with chunk sizes 1, 5, 16, 37, 64 and tail chunks, against
// the token recurrence; and the bit-reproducibility the serving stack relies on: the same inputs give the same
// bits with any OpenMP thread count, at any buffer alignment, and for a head whatever other heads share the call.
// Tolerance as in kda_test.cpp: max|chunked − recurrent| <= 2e-5 · max(max|recurrent|, floor), floor 0.1 for
// outputs and 1 for states.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kda.h"

namespace kestrel {
namespace {

using kernels::KdaArgs;

struct Inputs {
  int64_t T, H, K, V;
  std::vector<float> q, k, v, g, beta, state;
  // l2-normalised q/k, v ~ N(0,1), β in (0,1), per-channel decay rates up to gate_mag (some channels decay to
  // exp underflow within a chunk), an asymmetric initial state.
  Inputs(int64_t T_, int64_t H_, int64_t K_, int64_t V_, uint32_t seed, float gate_mag)
      : T(T_), H(H_), K(K_), V(V_), q(T * H * K), k(T * H * K), v(T * H * V), g(T * H * K), beta(T * H),
        state(H * K * V) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    for (auto* x : {&q, &k}) {
      for (int64_t i = 0; i < T * H; ++i) {
        double ss = 0.0;
        for (int64_t d = 0; d < K; ++d) ss += std::pow((*x)[i * K + d] = nd(rng), 2);
        for (int64_t d = 0; d < K; ++d) (*x)[i * K + d] /= static_cast<float>(std::sqrt(ss + 1e-6));
      }
    }
    for (auto& x : v) x = nd(rng);
    std::vector<float> chan(static_cast<size_t>(H * K));
    for (auto& c : chan) c = gate_mag * ud(rng) * ud(rng);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * K; ++i) g[t * H * K + i] = -chan[i] * (0.5f + ud(rng));
    for (auto& b : beta) b = 1.0f / (1.0f + std::exp(-nd(rng)));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) state[(h * K + i) * V + j] = nd(rng) + (i < j ? 1.5f : -0.75f);
  }
};

// Runs the whole sequence; returns out and leaves the final state in `st`.
std::vector<float> run(const Inputs& in, std::vector<float>& st, int64_t chunk) {
  std::vector<float> out(static_cast<size_t>(in.T * in.H * in.V), NAN);
  KdaArgs a;
  a.T = in.T;
  a.H = in.H;
  a.K = in.K;
  a.V = in.V;
  a.q = in.q.data();
  a.k = in.k.data();
  a.v = in.v.data();
  a.g = in.g.data();
  a.beta = in.beta.data();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in.K)));
  a.state = st.data();
  a.out = out.data();
  if (chunk == 0) kernels::kda_recurrent(a);
  else kernels::kda_chunked(a, chunk);
  return out;
}

double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double floor, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  const double scale = std::max(max_abs(ref), floor);
  double err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
  }
  EXPECT_LE(err, 2e-5 * scale) << what << ": max abs err " << err << " (scale " << scale << ")";
}

TEST(KdaChunked, MatchesRecurrentOnUnpaddedHeads) {
  struct Shape {
    int64_t T, H, K, V;
    float gate_mag;
  };
  for (const Shape& s : {Shape{150, 3, 13, 21, 2.0f}, Shape{97, 2, 20, 12, 8.0f}, Shape{130, 2, 128, 128, 2.0f},
                         Shape{70, 2, 7, 129, 30.0f}}) {
    const Inputs in(s.T, s.H, s.K, s.V, 41, s.gate_mag);
    std::vector<float> st_ref = in.state;
    const std::vector<float> out_ref = run(in, st_ref, 0);
    for (int64_t chunk : {64, 37, 16, 5, 1}) {
      std::vector<float> st = in.state;
      const std::vector<float> out = run(in, st, chunk);
      const std::string what = "K=" + std::to_string(s.K) + " V=" + std::to_string(s.V) + " chunk " +
                               std::to_string(chunk);
      expect_close(out, out_ref, 0.1, what + " out");
      expect_close(st, st_ref, 1.0, what + " state");
    }
  }
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << what;
}

TEST(KdaChunked, BitsIndependentOfThreadsAlignmentAndOtherHeads) {
  const Inputs in(150, 5, 128, 128, 43, 4.0f);  // chunks of 64, 64, 22 rows
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::vector<float> st_ref = in.state;
  const std::vector<float> out_ref = run(in, st_ref, 64);
  for (int threads : {1, 3, 5}) {
    omp_set_num_threads(threads);
    std::vector<float> st = in.state;
    const std::vector<float> out = run(in, st, 64);
    expect_same_bits(out, out_ref, std::to_string(threads) + " threads out");
    expect_same_bits(st, st_ref, std::to_string(threads) + " threads state");
  }
  omp_set_num_threads(saved);

  // Inputs, state and output at offsets of 1..3 floats from where the vectors put them.
  for (int64_t off : {1, 2, 3}) {
    auto shifted = [off](const std::vector<float>& x) {
      std::vector<float> y(x.size() + static_cast<size_t>(off), 0.0f);
      std::copy(x.begin(), x.end(), y.begin() + off);
      return y;
    };
    std::vector<float> q = shifted(in.q), k = shifted(in.k), v = shifted(in.v), g = shifted(in.g),
                       beta = shifted(in.beta), st = shifted(in.state), out(in.T * in.H * in.V + off);
    KdaArgs a;
    a.T = in.T;
    a.H = in.H;
    a.K = in.K;
    a.V = in.V;
    a.q = q.data() + off;
    a.k = k.data() + off;
    a.v = v.data() + off;
    a.g = g.data() + off;
    a.beta = beta.data() + off;
    a.scale = static_cast<float>(1.0 / std::sqrt(128.0));
    a.state = st.data() + off;
    a.out = out.data() + off;
    kernels::kda_chunked(a, 64);
    expect_same_bits(std::vector<float>(out.begin() + off, out.end()), out_ref, "offset " + std::to_string(off) + " out");
    expect_same_bits(std::vector<float>(st.begin() + off, st.end()), st_ref, "offset " + std::to_string(off) + " state");
  }

  // Head 3 alone (a one-head call on its slice of every input) gives head 3's bits of the five-head call.
  const int64_t h = 3, T = in.T, K = in.K, V = in.V, H = in.H;
  Inputs one = in;
  one.H = 1;
  one.q.resize(T * K), one.k.resize(T * K), one.g.resize(T * K), one.v.resize(T * V), one.beta.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(in.q.begin() + (t * H + h) * K, K, one.q.begin() + t * K);
    std::copy_n(in.k.begin() + (t * H + h) * K, K, one.k.begin() + t * K);
    std::copy_n(in.g.begin() + (t * H + h) * K, K, one.g.begin() + t * K);
    std::copy_n(in.v.begin() + (t * H + h) * V, V, one.v.begin() + t * V);
    one.beta[t] = in.beta[t * H + h];
  }
  std::vector<float> st1(in.state.begin() + h * K * V, in.state.begin() + (h + 1) * K * V);
  const std::vector<float> out1 = run(one, st1, 64);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_EQ(0, std::memcmp(&out1[t * V], &out_ref[(t * H + h) * V], sizeof(float) * V)) << "head alone, token " << t;
  expect_same_bits(st1, std::vector<float>(st_ref.begin() + h * K * V, st_ref.begin() + (h + 1) * K * V),
                   "head alone state");
}

}  // namespace
}  // namespace kestrel
