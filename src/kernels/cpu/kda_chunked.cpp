// KDA chunked (WY/UT) prefill, fp32. Math: docs/model-math.md §3.5 (recurrence order) and §3.6 (chunked form,
// numerics notes).
//
// Per head and chunk of n <= C rows (r, j index rows; chunk-local cumsum Γ_r = Σ_{s<=r} g_s; q already scaled):
//   L[r,j]   = β_r Σ_d k_r[d] k_j[d] exp(Γ_r[d] − Γ_j[d])      j <  r
//   Aqk[r,j] =     Σ_d q_r[d] k_j[d] exp(Γ_r[d] − Γ_j[d])      j <= r
//   (I + L) V' = diag(β) (V − (exp(Γ) ⊙ K) S)                    (forward substitution)
//   O = (q ⊙ exp(Γ)) S + Aqk V';   S ← diag(exp(Γ_{n−1})) S + Σ_j (exp(Γ_{n−1} − Γ_j) ⊙ k_j) V'_jᵀ
// V' is the UT form's U − W S with (I + L) W = diag(β) (exp(Γ) ⊙ K) and (I + L) U = diag(β) V: one substitution
// on V − (exp(Γ) ⊙ K) S gives it without forming W. A tail chunk simply has n < C rows.
//
// Steps per chunk, all on per-thread scratch whose rows are padded with zeros to whole vectors (kda_vec.h):
//   1. gather q·scale, k, Γ, −β; Z = β v, O = 0;
//   2. one product [q ⊙ e^Γ; −β k ⊙ e^Γ] · S accumulated into [O; Z] (kda_gemm.h);
//   3. Gram matrices Aqk and −L by recursive halving (below);
//   4. forward substitution Z → V' fused with O += Aqk V', row by row over column strips kept in registers;
//   5. S ← diag(e^Γ_last) S + Kdᵀ V' (one product, Kd[j] = k_j ⊙ exp(Γ_last − Γ_j) read transposed).
//
// Numerics: only exp of non-positive numbers is ever formed. The Gram block of rows [m, e) and columns [s, m)
// (s < m < e) uses the reference row m: exp(Γ_r − Γ_j) = exp(Γ_r − Γ_m) · exp(Γ_m − Γ_j) with j < m <= r, both
// factors <= 1 (Γ is non-increasing), so it is a plain product of row-scaled q/k and column-scaled k; the two
// diagonal halves [s, m) and [m, e) recurse, down to blocks of at most kGramLeaf rows whose pairs use one exp per
// element. The state S of a head stays in scratch across its chunks.
//
// Bits: a chunk's results depend on its own inputs, n and the chunk's state only (not on C, the thread count,
// or where the buffers lie), as each head runs on one thread in a fixed order.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "kernels/cpu/kda.h"
#include "kernels/cpu/kda_gemm.h"
#include "kernels/cpu/kda_vec.h"

namespace kestrel::kernels {
namespace {

using kda::kLanes;
using kda::vf;

constexpr int64_t kGramLeaf = 4;
// Columns per register strip of the fused substitution: 4 vectors of V' and 4 of O accumulate at once.
constexpr int kStripVecs = 4;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 64-byte aligned float buffer.
struct Buf {
  float* p = nullptr;
  explicit Buf(int64_t n)
      : p(static_cast<float*>(::operator new[](sizeof(float) * static_cast<size_t>(std::max<int64_t>(n, 1)),
                                                std::align_val_t{64}))) {}
  ~Buf() { ::operator delete[](p, std::align_val_t{64}); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Per-thread scratch for chunks of up to C rows (C is also the leading dimension of aqk and ln), K and V padded
// to Kp and Vp.
struct ChunkScratch {
  int64_t C, K, V, Kp, Vp;
  Buf q, k, gam;      // [C×Kp] each: q·scale, k, Γ
  Buf nb;             // [C] −β
  Buf qw;             // [2C×Kp]: rows [0, n) q ⊙ e^Γ, rows [n, 2n) −β k ⊙ e^Γ; then Kd[j] = exp(Γ_last − Γ_j) ⊙ k_j
  Buf oz;             // [2C×Vp]: rows [0, n) O, rows [n, 2n) Z, then V'
  Buf aqk, ln;        // [C×C]: Aqk and −L (lower triangles)
  Buf rq, rk, ck;     // Gram block operands [⌈C/2⌉×Kp] each: row-scaled q and −β k, column-scaled k
  Buf S;              // [Kp×Vp] state of the current head
  Buf f;              // [Kp] exp(Γ_last)
  Buf zero;           // [Kp] zeros
  ChunkScratch(int64_t C_, int64_t K_, int64_t V_)
      : C(C_), K(K_), V(V_), Kp(round_up(K_, kLanes)), Vp(round_up(V, kLanes)), q(C * Kp), k(C * Kp), gam(C * Kp), nb(C),
        qw(2 * C * Kp), oz(2 * C * Vp), aqk(C * C), ln(C * C), rq((C + 1) / 2 * Kp), rk((C + 1) / 2 * Kp),
        ck((C + 1) / 2 * Kp),
        S(Kp * Vp), f(Kp), zero(Kp) {
    std::fill(zero.p, zero.p + Kp, 0.0f);
  }
};

// The calling thread's scratch, kept from call to call (a prefill calls once per layer; fresh pages would fault
// in every time), regrown when a call needs more rows or other head sizes. S is zeroed (its pads must be).
ChunkScratch& thread_chunk_scratch(int64_t C, int64_t K, int64_t V) {
  thread_local std::unique_ptr<ChunkScratch> w;
  if (!w || w->C < C || w->K != K || w->V != V) w = std::make_unique<ChunkScratch>(C, K, V);
  std::fill(w->S.p, w->S.p + w->Kp * w->Vp, 0.0f);
  return *w;
}

// dst = src ⊙ exp(a − b) over Kp floats (a − b <= 0 elementwise).
inline void scale_exp(float* dst, const float* src, const float* a, const float* b, int64_t Kp) {
  for (int64_t d = 0; d < Kp; d += kLanes)
    kda::store(dst + d, kda::load(src + d) * kda::exp_nonpos(kda::load(a + d) - kda::load(b + d)));
}

// Gram entries of the rows and columns [s, e) of the chunk (j <= r for Aqk, j < r for −L).
void gram_block(ChunkScratch& w, int64_t s, int64_t e) {
  const int64_t Kp = w.Kp, C = w.C;
  const float* q = w.q.p;
  const float* k = w.k.p;
  const float* gam = w.gam.p;
  if (e - s <= kGramLeaf) {
    float* ev = w.ck.p;  // one row
    for (int64_t r = s; r < e; ++r) {
      const float* qr = q + r * Kp;
      const float* kr = k + r * Kp;
      for (int64_t j = s; j < r; ++j) {
        scale_exp(ev, k + j * Kp, gam + r * Kp, gam + j * Kp, Kp);
        vf aq{}, al{};
        for (int64_t d = 0; d < Kp; d += kLanes) {
          const vf x = kda::load(ev + d);
          aq += kda::load(qr + d) * x;
          al += kda::load(kr + d) * x;
        }
        w.aqk.p[r * C + j] = kda::hsum(aq);
        w.ln.p[r * C + j] = w.nb.p[r] * kda::hsum(al);
      }
      vf aq{};
      for (int64_t d = 0; d < Kp; d += kLanes) aq += kda::load(qr + d) * kda::load(kr + d);
      w.aqk.p[r * C + r] = kda::hsum(aq);
    }
    return;
  }
  const int64_t m = s + (e - s) / 2;
  const float* gm = gam + m * Kp;
  for (int64_t r = m; r < e; ++r) {
    const float* gr = gam + r * Kp;
    float* rq = w.rq.p + (r - m) * Kp;
    float* rk = w.rk.p + (r - m) * Kp;
    const float nbr = w.nb.p[r];
    for (int64_t d = 0; d < Kp; d += kLanes) {
      const vf x = kda::exp_nonpos(kda::load(gr + d) - kda::load(gm + d));
      kda::store(rq + d, kda::load(q + r * Kp + d) * x);
      kda::store(rk + d, kda::load(k + r * Kp + d) * x * nbr);
    }
  }
  for (int64_t j = s; j < m; ++j) scale_exp(w.ck.p + (j - s) * Kp, k + j * Kp, gm, gam + j * Kp, Kp);
  kda::gram_nt(e - m, m - s, Kp, w.rq.p, Kp, w.ck.p, Kp, w.aqk.p + m * C + s, C);
  kda::gram_nt(e - m, m - s, Kp, w.rk.p, Kp, w.ck.p, Kp, w.ln.p + m * C + s, C);
  gram_block(w, s, m);
  gram_block(w, m, e);
}

// Columns [c0, c0 + NV·kLanes) of: V'_r = Z_r + Σ_{j<r} (−L)[r,j] V'_j (in place in Z), then
// O_r += Σ_{j<=r} Aqk[r,j] V'_j, for r = 0 … n−1.
template <int NV>
void substitute_strip(const ChunkScratch& w, int64_t n, float* O, float* Z, int64_t c0) {
  const int64_t Vp = w.Vp, C = w.C;
  for (int64_t r = 0; r < n; ++r) {
    const float* lr = w.ln.p + r * C;
    const float* ar = w.aqk.p + r * C;
    vf z[NV], o[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      z[v] = kda::load(Z + r * Vp + c0 + v * kLanes);
      o[v] = kda::load(O + r * Vp + c0 + v * kLanes);
    }
    for (int64_t j = 0; j < r; ++j) {
      const float l = lr[j], c = ar[j];
      const float* xj = Z + j * Vp + c0;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const vf x = kda::load(xj + v * kLanes);
        z[v] += l * x;
        o[v] += c * x;
      }
    }
    const float c = ar[r];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      kda::store(Z + r * Vp + c0 + v * kLanes, z[v]);
      kda::store(O + r * Vp + c0 + v * kLanes, o[v] + c * z[v]);
    }
  }
}

// Brings the inputs of tokens [t0, t0 + n) of head h towards the core (into L2).
void prefetch_chunk(const KdaArgs& a, int64_t h, int64_t t0, int64_t n) {
  if (h >= a.H) return;
  n = std::min(n, a.T - t0);
  constexpr int64_t kLine = 64 / sizeof(float);
  for (int64_t t = t0; t < t0 + n; ++t) {
    for (const float* p : {a.q + (t * a.H + h) * a.K, a.k + (t * a.H + h) * a.K, a.g + (t * a.H + h) * a.K})
      for (int64_t d = 0; d < a.K; d += kLine) __builtin_prefetch(p + d, 0, 2);
    const float* v = a.v + (t * a.H + h) * a.V;
    for (int64_t d = 0; d < a.V; d += kLine) __builtin_prefetch(v + d, 0, 2);
  }
}

// One chunk of n rows starting at token t0 for head h; the head's state is in w.S.
void chunk_head(const KdaArgs& a, int64_t h, int64_t t0, int64_t n, ChunkScratch& w) {
  const int64_t H = a.H, K = a.K, V = a.V, Kp = w.Kp, Vp = w.Vp;
  float* O = w.oz.p;
  float* Z = w.oz.p + n * Vp;

  // 1. Gather (pads stay zero: q = k = Γ = 0 there, and exp(0) · 0 = 0).
  const int64_t kv = K - K % kLanes, vv = V - V % kLanes;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = t0 + r;
    const float* qs = a.q + (t * H + h) * K;
    const float* ks = a.k + (t * H + h) * K;
    const float* gs = a.g + (t * H + h) * K;
    const float* vs = a.v + (t * H + h) * V;
    const float b = a.beta[t * H + h];
    float* qr = w.q.p + r * Kp;
    float* kr = w.k.p + r * Kp;
    float* gr = w.gam.p + r * Kp;
    const float* gp = r == 0 ? w.zero.p : gr - Kp;  // Γ_{r−1}, 0 before the chunk
    for (int64_t d = 0; d < kv; d += kLanes) {
      const vf kd = kda::load(ks + d);
      kda::store(qr + d, kda::load(qs + d) * a.scale);
      kda::store(kr + d, kd);
      kda::store(gr + d, kda::load(gp + d) + kda::load(gs + d));
    }
    for (int64_t d = kv; d < K; ++d) {
      qr[d] = qs[d] * a.scale;
      kr[d] = ks[d];
      gr[d] = gp[d] + gs[d];
    }
    for (int64_t d = K; d < Kp; ++d) qr[d] = kr[d] = gr[d] = 0.0f;
    w.nb.p[r] = -b;
    float* zr = Z + r * Vp;
    for (int64_t x = 0; x < vv; x += kLanes) kda::store(zr + x, kda::load(vs + x) * b);
    for (int64_t x = vv; x < V; ++x) zr[x] = vs[x] * b;
    std::fill(zr + V, zr + Vp, 0.0f);
    std::fill(O + r * Vp, O + (r + 1) * Vp, 0.0f);
  }
  // 2. [O; Z] += [q ⊙ e^Γ; −β k ⊙ e^Γ] · S (one pass over S for both).
  const float* glast = w.gam.p + (n - 1) * Kp;
  for (int64_t r = 0; r < n; ++r) {
    const float* gr = w.gam.p + r * Kp;
    const float nbr = w.nb.p[r];
    for (int64_t d = 0; d < Kp; d += kLanes) {
      const vf e = kda::exp_nonpos(kda::load(gr + d));
      kda::store(w.qw.p + r * Kp + d, kda::load(w.q.p + r * Kp + d) * e);
      kda::store(w.qw.p + (n + r) * Kp + d, kda::load(w.k.p + r * Kp + d) * e * nbr);
      if (r == n - 1) kda::store(w.f.p + d, e);
    }
  }
  kda::gemm_acc(2 * n, Vp, Kp, w.qw.p, Kp, 1, w.S.p, Vp, w.oz.p, Vp);

  // 3. Aqk and −L.
  gram_block(w, 0, n);

  // The next chunk's rows of this head (or the first of the next head) are fetched while this one finishes.
  prefetch_chunk(a, t0 + n < a.T ? h : h + 1, t0 + n < a.T ? t0 + n : 0, n);
  // 4. Z → V' and O += Aqk V'.
  int64_t c0 = 0;
  for (; c0 + kStripVecs * kLanes <= Vp; c0 += kStripVecs * kLanes) substitute_strip<kStripVecs>(w, n, O, Z, c0);
  for (; c0 < Vp; c0 += kLanes) substitute_strip<1>(w, n, O, Z, c0);
  for (int64_t r = 0; r < n; ++r) std::memcpy(a.out + ((t0 + r) * H + h) * V, O + r * Vp, sizeof(float) * V);


  // 5. S ← diag(e^Γ_last) S + Kdᵀ V'.
  for (int64_t j = 0; j < n; ++j) scale_exp(w.qw.p + j * Kp, w.k.p + j * Kp, glast, w.gam.p + j * Kp, Kp);
  for (int64_t d = 0; d < Kp; ++d) {
    const float fd = w.f.p[d];
    float* Sd = w.S.p + d * Vp;
    for (int64_t x = 0; x < Vp; x += kLanes) kda::store(Sd + x, kda::load(Sd + x) * fd);
  }
  kda::gemm_acc(Kp, Vp, n, w.qw.p, 1, Kp, Z, Vp, w.S.p, Vp);
}

}  // namespace

void kda_chunked(const KdaArgs& a, int64_t chunk) {
  if (a.T <= 0 || a.H <= 0) return;
  const int64_t C = std::max<int64_t>(1, std::min(chunk, a.T));
#pragma omp parallel
  {
    ChunkScratch& w = thread_chunk_scratch(C, a.K, a.V);
#pragma omp for schedule(static)
    for (int64_t h = 0; h < a.H; ++h) {
      float* S = a.state + h * a.K * a.V;
      for (int64_t d = 0; d < a.K; ++d) std::memcpy(w.S.p + d * w.Vp, S + d * a.V, sizeof(float) * a.V);
      for (int64_t t0 = 0; t0 < a.T; t0 += C) {
        chunk_head(a, h, t0, std::min(C, a.T - t0), w);
      }
      for (int64_t d = 0; d < a.K; ++d) std::memcpy(S + d * a.V, w.S.p + d * w.Vp, sizeof(float) * a.V);
    }
  }
}

}  // namespace kestrel::kernels
