// Kimi Delta Attention core, fp32 CPU kernels. Math: docs/model-math.md §3.5
// (recurrence order) and §3.6 (chunked WY/UT form, numerics notes).
//
// Chunked form, per head and chunk of n <= C rows (r, j index rows; chunk-local cumsum Γ_r = Σ_{s<=r} g_s):
//   L[r,j]   = β_r Σ_d k_r[d] k_j[d] exp(Γ_r[d] − Γ_j[d])      j <  r
//   Aqk[r,j] =     Σ_d q_r[d] k_j[d] exp(Γ_r[d] − Γ_j[d])      j <= r   (q already scaled)
//   (I + L) W = diag(β) (exp(Γ) ⊙ K),  (I + L) U = diag(β) V     (forward substitution: the UT transform
//                                                               T = (I+L)^{-1} diag(β) is never formed)
//   V' = U − W S;   O = (q ⊙ exp(Γ)) S + Aqk V';   S ← diag(exp(Γ_{n−1})) S + Σ_j (exp(Γ_{n−1} − Γ_j) ⊙ k_j) V'_jᵀ
// A tail chunk simply has n < C rows; no padding is needed (padding with g = 0, β = 0 would be equivalent).
//
// Numerics: only exp of non-positive numbers is ever formed. Off-diagonal 16-row sub-blocks use the
// reference row s (first row of the row block): exp(Γ_r − Γ_j) = exp(Γ_r − Γ_s) · exp(Γ_s − Γ_j), with
// j < s <= r both factors are <= 1 (Γ is non-increasing). Diagonal sub-blocks use per-element exps.
#include "kernels/cpu/kda.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace kestrel::kernels {
namespace {

// exp(x) for x <= 0 (Cephes-style range reduction + degree-6 polynomial, ~1-2 ulp). Written with plain
// float ops so that loops calling it vectorise (glibc's vector expf is only declared under -ffast-math).
// Returns exactly 0 below the smallest normal result (x < -87.3); x > 0 is not supported.
inline float exp_nonpos(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;
  const float kLn2Lo = -2.12194440e-4f;
  const bool under = x < -87.3f;
  x = under ? -87.3f : x;
  // Round-to-nearest via the 1.5*2^23 trick (valid for |x*log2e| < 2^22).
  const float kMagic = 12582912.0f;
  const float n = (x * kLog2e + kMagic) - kMagic;
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;  // n in [-126, 0]
  const float scale = std::bit_cast<float>(e);
  return under ? 0.0f : p * scale;
}

// C[M×N] += A[M×Kd] · B[Kd×N]  (all row-major with leading dims). Register tile of 4 rows × 32 columns
// kept in local accumulators across the whole Kd loop (each B row segment is loaded once per 4 rows and
// C is read/written once); edges fall back to a row-at-a-time axpy form. All inner loops vectorise.
inline void gemm_acc(int64_t M, int64_t N, int64_t Kd, const float* A, int64_t lda, const float* B,
                     int64_t ldb, float* C, int64_t ldc) {
  constexpr int64_t kTn = 32;
  const int64_t n_full = N - N % kTn;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    const float* a0 = A + (m + 0) * lda;
    const float* a1 = A + (m + 1) * lda;
    const float* a2 = A + (m + 2) * lda;
    const float* a3 = A + (m + 3) * lda;
    for (int64_t n0 = 0; n0 < n_full; n0 += kTn) {
      float c0[kTn], c1[kTn], c2[kTn], c3[kTn];
      for (int64_t n = 0; n < kTn; ++n) {
        c0[n] = C[(m + 0) * ldc + n0 + n];
        c1[n] = C[(m + 1) * ldc + n0 + n];
        c2[n] = C[(m + 2) * ldc + n0 + n];
        c3[n] = C[(m + 3) * ldc + n0 + n];
      }
      for (int64_t kk = 0; kk < Kd; ++kk) {
        const float* b = B + kk * ldb + n0;
        const float x0 = a0[kk], x1 = a1[kk], x2 = a2[kk], x3 = a3[kk];
#pragma omp simd
        for (int64_t n = 0; n < kTn; ++n) {
          const float bn = b[n];
          c0[n] += x0 * bn;
          c1[n] += x1 * bn;
          c2[n] += x2 * bn;
          c3[n] += x3 * bn;
        }
      }
      for (int64_t n = 0; n < kTn; ++n) {
        C[(m + 0) * ldc + n0 + n] = c0[n];
        C[(m + 1) * ldc + n0 + n] = c1[n];
        C[(m + 2) * ldc + n0 + n] = c2[n];
        C[(m + 3) * ldc + n0 + n] = c3[n];
      }
    }
    if (n_full < N) {
      for (int64_t i = 0; i < 4; ++i) {
        float* ci = C + (m + i) * ldc;
        const float* ai = A + (m + i) * lda;
        for (int64_t kk = 0; kk < Kd; ++kk) {
          const float* b = B + kk * ldb;
          const float x = ai[kk];
#pragma omp simd
          for (int64_t n = n_full; n < N; ++n) ci[n] += x * b[n];
        }
      }
    }
  }
  for (; m < M; ++m) {
    float* c0 = C + m * ldc;
    const float* a0 = A + m * lda;
    for (int64_t kk = 0; kk < Kd; ++kk) {
      const float* b = B + kk * ldb;
      const float x0 = a0[kk];
#pragma omp simd
      for (int64_t n = 0; n < N; ++n) c0[n] += x0 * b[n];
    }
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Per-thread scratch for one chunk (sizes for the full chunk size C).
struct ChunkScratch {
  std::vector<float> q, k, v, gam, beta;  // gathered chunk: q (scaled) [C×K], k [C×K], v [C×V], Γ [C×K], β [C]
  std::vector<float> L, Aqk;               // [C×C]
  std::vector<float> W, U;                 // [C×K], [C×V]
  std::vector<float> qs, ks, kj, e;        // sub-block scratch: [C×K] each (e: one row [K])
  std::vector<float> O;                    // [C×V]
  ChunkScratch(int64_t C, int64_t K, int64_t V)
      : q(C * K), k(C * K), v(C * V), gam(C * K), beta(C), L(C * C), Aqk(C * C), W(C * K), U(C * V),
        qs(C * K), ks(C * K), kj(C * K), e(K), O(C * V) {}
};

constexpr int64_t kSubBlock = 16;

// One chunk of n rows for one head; S [K×V] is updated in place.
void kda_chunk_head(const KdaArgs& a, int64_t h, int64_t t0, int64_t n, int64_t C, float* S,
                    ChunkScratch& w) {
  const int64_t H = a.H, K = a.K, V = a.V;
  float* q = w.q.data();
  float* k = w.k.data();
  float* v = w.v.data();
  float* gam = w.gam.data();
  float* beta = w.beta.data();
  float* L = w.L.data();
  float* Aqk = w.Aqk.data();

  // 1. Gather the chunk, scale q, chunk-local cumsum of g.
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = t0 + r;
    const float* qs = a.q + (t * H + h) * K;
    const float* ks = a.k + (t * H + h) * K;
    const float* gs = a.g + (t * H + h) * K;
    const float* vs = a.v + (t * H + h) * V;
    float* qr = q + r * K;
    float* gr = gam + r * K;
    const float* gp = gam + (r - 1) * K;
    for (int64_t d = 0; d < K; ++d) qr[d] = qs[d] * a.scale;
    std::memcpy(k + r * K, ks, sizeof(float) * K);
    std::memcpy(v + r * V, vs, sizeof(float) * V);
    if (r == 0) {
      std::memcpy(gr, gs, sizeof(float) * K);
    } else {
      for (int64_t d = 0; d < K; ++d) gr[d] = gp[d] + gs[d];
    }
    beta[r] = a.beta[t * H + h];
  }

  // 2. Gram matrices L (strict lower, row-scaled by β) and Aqk (lower incl. diagonal), by sub-blocks.
  for (int64_t s = 0; s < n; s += kSubBlock) {
    const int64_t e_end = std::min(n, s + kSubBlock);
    const float* gs = gam + s * K;
    // Row factors exp(Γ_r − Γ_s) <= 1 applied to q_r and k_r.
    for (int64_t r = s; r < e_end; ++r) {
      const float* gr = gam + r * K;
      const float* qr = q + r * K;
      const float* kr = k + r * K;
      float* qsr = w.qs.data() + r * K;
      float* ksr = w.ks.data() + r * K;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) {
        const float f = exp_nonpos(gr[d] - gs[d]);
        qsr[d] = qr[d] * f;
        ksr[d] = kr[d] * f;
      }
    }
    // Column factors exp(Γ_s − Γ_j) <= 1 applied to k_j, j < s.
    for (int64_t j = 0; j < s; ++j) {
      const float* gj = gam + j * K;
      const float* kjs = k + j * K;
      float* kjr = w.kj.data() + j * K;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) kjr[d] = kjs[d] * exp_nonpos(gs[d] - gj[d]);
    }
    for (int64_t r = s; r < e_end; ++r) {
      const float* qsr = w.qs.data() + r * K;
      const float* ksr = w.ks.data() + r * K;
      for (int64_t j = 0; j < s; ++j) {
        const float* kjr = w.kj.data() + j * K;
        Aqk[r * C + j] = dot(qsr, kjr, K);
        L[r * C + j] = beta[r] * dot(ksr, kjr, K);
      }
      // Diagonal block: per-element exp(Γ_r − Γ_j), s <= j <= r.
      const float* gr = gam + r * K;
      const float* qr = q + r * K;
      const float* kr = k + r * K;
      float* ev = w.e.data();
      for (int64_t j = s; j <= r; ++j) {
        const float* gj = gam + j * K;
        const float* kjs = k + j * K;
#pragma omp simd
        for (int64_t d = 0; d < K; ++d) ev[d] = kjs[d] * exp_nonpos(gr[d] - gj[d]);
        Aqk[r * C + j] = dot(qr, ev, K);
        L[r * C + j] = (j < r) ? beta[r] * dot(kr, ev, K) : 0.0f;
      }
    }
  }

  // 3. UT transform by forward substitution: X_r = β_r Y_r − Σ_{j<r} L[r,j] X_j for
  //    Y = exp(Γ) ⊙ K (→ W) and Y = V (→ U).
  float* W = w.W.data();
  float* U = w.U.data();
  for (int64_t r = 0; r < n; ++r) {
    float* Wr = W + r * K;
    float* Ur = U + r * V;
    const float* gr = gam + r * K;
    const float* kr = k + r * K;
    const float* vr = v + r * V;
    const float br = beta[r];
#pragma omp simd
    for (int64_t d = 0; d < K; ++d) Wr[d] = br * (exp_nonpos(gr[d]) * kr[d]);
#pragma omp simd
    for (int64_t d = 0; d < V; ++d) Ur[d] = br * vr[d];
    for (int64_t j = 0; j < r; ++j) {
      const float l = L[r * C + j];
      const float* Wj = W + j * K;
      const float* Uj = U + j * V;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) Wr[d] -= l * Wj[d];
#pragma omp simd
      for (int64_t d = 0; d < V; ++d) Ur[d] -= l * Uj[d];
    }
  }

  // 4. Pseudo-values V' = U − W S (stored in U), using the chunk-entry state.
  //    Negate W in place (no longer needed) so the GEMM helper only accumulates.
  for (int64_t i = 0; i < n * K; ++i) W[i] = -W[i];
  gemm_acc(n, V, K, W, K, S, V, U, V);
  const float* Vp = U;

  // 5. O = (q ⊙ exp(Γ)) S + Aqk V'. Reuse qs as q ⊙ exp(Γ).
  float* qg = w.qs.data();
  for (int64_t r = 0; r < n; ++r) {
    const float* gr = gam + r * K;
    const float* qr = q + r * K;
    float* qgr = qg + r * K;
#pragma omp simd
    for (int64_t d = 0; d < K; ++d) qgr[d] = qr[d] * exp_nonpos(gr[d]);
  }
  float* O = w.O.data();
  std::fill(O, O + n * V, 0.0f);
  gemm_acc(n, V, K, qg, K, S, V, O, V);
  for (int64_t r = 0; r < n; ++r) {
    float* Or = O + r * V;
    for (int64_t j = 0; j <= r; ++j) {
      const float c = Aqk[r * C + j];
      const float* Vj = Vp + j * V;
#pragma omp simd
      for (int64_t d = 0; d < V; ++d) Or[d] += c * Vj[d];
    }
    std::memcpy(a.out + ((t0 + r) * H + h) * V, Or, sizeof(float) * V);
  }

  // 6. State update: S ← diag(exp(Γ_last)) S + Kdᵀ V' with Kd[j,d] = exp(Γ_last[d] − Γ_j[d]) k_j[d].
  //    Kd is stored transposed ([K×n], in ks) so the update is a plain GEMM S += Kdᵀ · V'.
  const float* glast = gam + (n - 1) * K;
  float* kdT = w.ks.data();  // [K × n], leading dim n
  for (int64_t j = 0; j < n; ++j) {
    const float* gj = gam + j * K;
    const float* kjs = k + j * K;
    float* ev = w.e.data();
#pragma omp simd
    for (int64_t d = 0; d < K; ++d) ev[d] = kjs[d] * exp_nonpos(glast[d] - gj[d]);
    for (int64_t d = 0; d < K; ++d) kdT[d * n + j] = ev[d];
  }
  for (int64_t d = 0; d < K; ++d) {
    const float f = exp_nonpos(glast[d]);
    float* Sd = S + d * V;
#pragma omp simd
    for (int64_t x = 0; x < V; ++x) Sd[x] *= f;
  }
  gemm_acc(K, V, n, kdT, n, Vp, V, S, V);
}

}  // namespace

namespace {

// One head of the recurrence over a.T tokens; p [V] and decay [K] are scratch.
void recurrent_head(const KdaArgs& a, int64_t h, float* pv, float* decay) {
  const int64_t T = a.T, H = a.H, K = a.K, V = a.V;
  float* S = a.state + h * K * V;
  for (int64_t t = 0; t < T; ++t) {
    const float* q = a.q + (t * H + h) * K;
    const float* k = a.k + (t * H + h) * K;
    const float* v = a.v + (t * H + h) * V;
    const float* g = a.g + (t * H + h) * K;
    const float b = a.beta[t * H + h];
    float* o = a.out + (t * H + h) * V;
    for (int64_t d = 0; d < K; ++d) decay[d] = std::exp(g[d]);
    // S ← diag(exp(g)) S;  p = Sᵀ k (from the decayed state).
    std::fill(pv, pv + V, 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * V;
      const float f = decay[d];
      const float kd = k[d];
#pragma omp simd
      for (int64_t x = 0; x < V; ++x) {
        Sd[x] *= f;
        pv[x] += kd * Sd[x];
      }
    }
    // u = β (v − p);  S ← S + k uᵀ;  o = Sᵀ (scale q) read after the update.
    for (int64_t x = 0; x < V; ++x) pv[x] = b * (v[x] - pv[x]);
    std::fill(o, o + V, 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * V;
      const float kd = k[d];
      const float qd = q[d] * a.scale;
#pragma omp simd
      for (int64_t x = 0; x < V; ++x) {
        Sd[x] += kd * pv[x];
        o[x] += qd * Sd[x];
      }
    }
  }
}

}  // namespace

void kda_recurrent_many(std::span<const KdaArgs> args) {
  int64_t total = 0;
  for (const KdaArgs& a : args) total += a.H;
  // (sequence, head) pairs in one parallel region: a decode step of B sequences forks once.
  int64_t maxK = 1, maxV = 1;
  for (const KdaArgs& a : args) maxK = std::max(maxK, a.K), maxV = std::max(maxV, a.V);
  parallel_for(0, total, 1, true, [&](int64_t i) {
    float* p = thread_scratch(kScratchKdaP, static_cast<size_t>(maxV));
    float* decay = thread_scratch(kScratchKdaDecay, static_cast<size_t>(maxK));
    size_t s = 0;
    int64_t h = i;
    while (h >= args[s].H) h -= args[s++].H;
    recurrent_head(args[s], h, p, decay);
  });
}

void kda_recurrent(const KdaArgs& a) { kda_recurrent_many(std::span<const KdaArgs>(&a, 1)); }

void kda_chunked(const KdaArgs& a, int64_t chunk) {
  if (a.T <= 0 || a.H <= 0) return;
  const int64_t C = std::max<int64_t>(1, std::min(chunk, a.T));
#pragma omp parallel
  {
    ChunkScratch w(C, a.K, a.V);
#pragma omp for schedule(static)
    for (int64_t h = 0; h < a.H; ++h) {
      float* S = a.state + h * a.K * a.V;
      for (int64_t t0 = 0; t0 < a.T; t0 += C) {
        const int64_t n = std::min(C, a.T - t0);
        kda_chunk_head(a, h, t0, n, C, S, w);
      }
    }
  }
}

}  // namespace kestrel::kernels
