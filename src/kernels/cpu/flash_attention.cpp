// Key-tiled attention with an online softmax (flash_attention.h): key/value packing, the score and P·V
// micro-kernels and the per-tile softmax update. Three builds of the same tile order and per-element arithmetic:
// AVX-512, AVX2 + FMA (CPUs without AVX-512, e.g. Zen 3: 6 rows × 16 keys for the scores, 6 rows × 16 value
// columns for P·V, libmvec's 8-lane expf), and scalar elsewhere.
#include "kernels/cpu/flash_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#include "kernels/cpu/scratch.h"

#if defined(__AVX512F__)
#include <immintrin.h>
extern "C" __m512 _ZGVeN16v_expf(__m512);
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
extern "C" __m256 _ZGVdN8v_expf(__m256);
#endif

namespace kestrel::kernels {

namespace {

constexpr int64_t kQkRows = 12;   // query rows per packed group and AVX-512 score micro-kernel (24 accumulators)
#if defined(__AVX512F__)
constexpr int64_t kPvRows = 6;    // rows per P·V micro-kernel
constexpr int64_t kPvChunks = 4;  // 16-float value columns per P·V micro-kernel (6 × 4 accumulators)
constexpr int64_t kValueRun = 64;  // keys per P·V micro-kernel call
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kQkSubRows = 6;  // query rows per AVX2 score micro-kernel (6 × 2 accumulators), half a group
constexpr int64_t kQkKeys = 16;    // keys per AVX2 score micro-kernel: half a panel
constexpr int64_t kPvRows = 6;     // rows per P·V micro-kernel
constexpr int64_t kPvChunks = 2;   // 8-float value columns per P·V micro-kernel (6 × 2), 16 | packed_head_width
constexpr int64_t kValueRun = 256;  // keys per P·V micro-kernel call: a 16 KB run of 16 value columns
#endif

// Per-thread scratch of n floats, 64-byte aligned.
float* aligned_scratch(int64_t n) {
  float* p = thread_scratch(kScratchVisionScores, static_cast<size_t>(n + 16));
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

int64_t key_panels(int64_t n) { return (n + kKeyPanel - 1) / kKeyPanel; }

#if defined(__AVX512F__)

// s[r·kKeyTile + c] = q_r · k_c for R query rows (packed [d][kQkRows]) and the kKeyPanel keys of one panel.
template <int R>
void score_panel(const float* qp, const float* panel, int64_t hd, float* s) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const __m512 k0 = _mm512_load_ps(panel + d * kKeyPanel), k1 = _mm512_load_ps(panel + d * kKeyPanel + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 qv = _mm512_set1_ps(qp[d * kQkRows + r]);
      acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(s + r * kKeyTile, acc[r][0]);
    _mm512_store_ps(s + r * kKeyTile + 16, acc[r][1]);
  }
}

// o[r·hdp + 16c + l] += Σ_{j < nk} p[r·kKeyTile + j] · v[j·hdp + 16c + l] for R rows and C 16-float column chunks,
// j in order.
template <int R, int C>
void accumulate_values(const float* p, const float* v, int64_t hdp, int64_t nk, float* o) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_load_ps(o + r * hdp + 16 * c);
  for (int64_t j = 0; j < nk; ++j) {
    __m512 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = _mm512_load_ps(v + j * hdp + 16 * c);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 pv = _mm512_set1_ps(p[r * kKeyTile + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(pv, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_store_ps(o + r * hdp + 16 * c, acc[r][c]);
}

using ScoreFn = void (*)(const float*, const float*, int64_t, float*);
using ValuesFn = void (*)(const float*, const float*, int64_t, int64_t, float*);

template <int... R>
constexpr std::array<ScoreFn, sizeof...(R)> score_table(std::integer_sequence<int, R...>) {
  return {&score_panel<R + 1>...};
}
template <int R, int... C>
constexpr std::array<ValuesFn, sizeof...(C)> values_row(std::integer_sequence<int, C...>) {
  return {&accumulate_values<R, C + 1>...};
}
template <int... R>
constexpr std::array<std::array<ValuesFn, kPvChunks>, sizeof...(R)> values_table(std::integer_sequence<int, R...>) {
  return {values_row<R + 1>(std::make_integer_sequence<int, kPvChunks>())...};
}
constexpr auto kScore = score_table(std::make_integer_sequence<int, kQkRows>());
constexpr auto kValues = values_table(std::make_integer_sequence<int, kPvRows>());

__mmask16 lanes(int64_t i, int64_t n) {
  return n - i >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - i)) - 1);
}

float sum_lanes(__m512 v) {
  float lane[16], total = 0.0f;
  _mm512_storeu_ps(lane, v);
  for (float x : lane) total += x;
  return total;
}

float max_lanes(__m512 v) {
  float lane[16], top = -INFINITY;
  _mm512_storeu_ps(lane, v);
  for (float x : lane) top = std::max(top, x);
  return top;
}

// One row's online-softmax step over nk scores: returns the new running max, turns the scores into
// exp(scale·s − max) in place and sets *tile_sum to their sum.
float exp_scores(float* row, int64_t nk, float scale, float running_max, float* tile_sum) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < nk; j += 16) mx = _mm512_mask_max_ps(mx, lanes(j, nk), mx, _mm512_load_ps(row + j));
  const float top = std::max(running_max, max_lanes(mx) * scale);
  const __m512 m = _mm512_set1_ps(top), sc = _mm512_set1_ps(scale);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < nk; j += 16) {
    const __mmask16 k = lanes(j, nk);
    const __m512 e = _mm512_maskz_mov_ps(k, _ZGVeN16v_expf(_mm512_fmsub_ps(_mm512_load_ps(row + j), sc, m)));
    _mm512_store_ps(row + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  *tile_sum = sum_lanes(sum);
  return top;
}

#elif defined(__AVX2__) && defined(__FMA__)

// s[r·kKeyTile + c] = q_r · k_c for R query rows (packed [d][kQkRows]) and kQkKeys keys of one panel (`keys` points
// at the first of them; rows of kKeyPanel floats). The AVX2 kernels unroll every loop over the accumulator array:
// without it GCC 12 keeps the array on the stack and stores it back on every iteration (half the speed).
template <int R>
void score_panel(const float* qp, const float* keys, int64_t hd, float* s) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const __m256 k0 = _mm256_load_ps(keys + d * kKeyPanel), k1 = _mm256_load_ps(keys + d * kKeyPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_broadcast_ss(qp + d * kQkRows + r);
      acc[r][0] = _mm256_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qv, k1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(s + r * kKeyTile, acc[r][0]);
    _mm256_store_ps(s + r * kKeyTile + 8, acc[r][1]);
  }
}

// o[r·hdp + 8c + l] += Σ_{j < nk} p[r·kKeyTile + j] · v[j·hdp + 8c + l] for R rows and C 8-float column chunks,
// j in order.
template <int R, int C>
void accumulate_values(const float* p, const float* v, int64_t hdp, int64_t nk, float* o) {
  __m256 acc[R][C];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_load_ps(o + r * hdp + 8 * c);
  for (int64_t j = 0; j < nk; ++j) {
    __m256 vv[C];
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) vv[c] = _mm256_load_ps(v + j * hdp + 8 * c);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 pv = _mm256_broadcast_ss(p + r * kKeyTile + j);
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(pv, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) _mm256_store_ps(o + r * hdp + 8 * c, acc[r][c]);
}

using ScoreFn = void (*)(const float*, const float*, int64_t, float*);
using ValuesFn = void (*)(const float*, const float*, int64_t, int64_t, float*);

template <int... R>
constexpr std::array<ScoreFn, sizeof...(R)> score_table(std::integer_sequence<int, R...>) {
  return {&score_panel<R + 1>...};
}
template <int... R>
constexpr std::array<ValuesFn, sizeof...(R)> values_table(std::integer_sequence<int, R...>) {
  return {&accumulate_values<R + 1, kPvChunks>...};
}
constexpr auto kScore = score_table(std::make_integer_sequence<int, kQkSubRows>());
constexpr auto kValues = values_table(std::make_integer_sequence<int, kPvRows>());

// All-ones in the lanes of [i, i + 8) below n.
__m256 lanes(int64_t i, int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n - i, 8))), idx));
}

float max_lanes(__m256 v) {
  float lane[8], top = -INFINITY;
  _mm256_storeu_ps(lane, v);
  for (float x : lane) top = std::max(top, x);
  return top;
}

// exp(scale·row[j] − top) for the 8 scores at j, zero in the lanes at or past nk.
__m256 exp8(const float* row, int64_t j, int64_t nk, __m256 sc, __m256 m) {
  return _mm256_and_ps(lanes(j, nk), _ZGVdN8v_expf(_mm256_fmsub_ps(_mm256_load_ps(row + j), sc, m)));
}

// One row's online-softmax step over nk scores: returns the new running max, turns the scores into
// exp(scale·s − max) in place and sets *tile_sum to their sum. The sum keeps 16 lanes (score j in lane j mod 16,
// two ymm) added in lane order, as the scalar build does.
float exp_scores(float* row, int64_t nk, float scale, float running_max, float* tile_sum) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int64_t j = 0; j < nk; j += 8)
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_load_ps(row + j), lanes(j, nk)));
  const float top = std::max(running_max, max_lanes(mx) * scale);
  const __m256 m = _mm256_set1_ps(top), sc = _mm256_set1_ps(scale);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  // Whole 16-float steps: the row has kKeyTile floats and scores up to the panel's end; lanes past nk are zeroed.
  for (int64_t j = 0; j < nk; j += 16) {
    const __m256 e0 = exp8(row, j, nk, sc, m), e1 = exp8(row, j + 8, nk, sc, m);
    _mm256_store_ps(row + j, e0);
    _mm256_store_ps(row + j + 8, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  float lane[16];
  _mm256_storeu_ps(lane, lo);
  _mm256_storeu_ps(lane + 8, hi);
  *tile_sum = 0.0f;
  for (float x : lane) *tile_sum += x;
  return top;
}

#else

float exp_scores(float* row, int64_t nk, float scale, float running_max, float* tile_sum) {
  float mx = -INFINITY, lane[16] = {};
  for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, row[j]);
  const float top = std::max(running_max, mx * scale);
  for (int64_t j = 0; j < nk; ++j) lane[j % 16] += row[j] = std::exp(std::fma(row[j], scale, -top));
  *tile_sum = 0.0f;
  for (float x : lane) *tile_sum += x;
  return top;
}

#endif

}  // namespace

int64_t packed_kv_floats(int64_t n, int64_t hd) { return key_panels(n) * kKeyPanel * hd + n * packed_head_width(hd); }

void pack_keys_values(const float* k, const float* v, int64_t ld, int64_t n, int64_t hd, float* packed) {
  const int64_t panels = key_panels(n), hdp = packed_head_width(hd);
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = packed + p * kKeyPanel * hd;
    for (int64_t jj = 0; jj < kKeyPanel; ++jj) {
      const int64_t j = p * kKeyPanel + jj;
      for (int64_t d = 0; d < hd; ++d) dst[d * kKeyPanel + jj] = j < n ? k[j * ld + d] : 0.0f;
    }
  }
  float* vals = packed + panels * kKeyPanel * hd;
  for (int64_t j = 0; j < n; ++j) {
    std::copy(v + j * ld, v + j * ld + hd, vals + j * hdp);
    std::fill(vals + j * hdp + hd, vals + (j + 1) * hdp, 0.0f);
  }
}

void attend_rows(const float* q, int64_t ldq, int64_t B, const float* packed, int64_t n, int64_t hd, float scale,
                 float* out, int64_t ldo) {
  if (B <= 0 || n <= 0) return;
  const int64_t hdp = packed_head_width(hd), groups = (B + kQkRows - 1) / kQkRows;
  const float* vals = packed + key_panels(n) * kKeyPanel * hd;
  float* s = aligned_scratch(B * kKeyTile + B * hdp + 2 * B + groups * hd * kQkRows);
  float* o = s + B * kKeyTile;  // unnormalised output rows, [B][hdp]
  float* mx = o + B * hdp;      // running max of scale · score per row
  float* sum = mx + B;          // running Σ exp(scale · score − max) per row
  float* qp = sum + B;          // query rows in groups of kQkRows, [group][d][kQkRows], zeros past B
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t r = 0; r < kQkRows; ++r) {
        const int64_t i = g * kQkRows + r;
        qp[(g * hd + d) * kQkRows + r] = i < B ? q[i * ldq + d] : 0.0f;
      }
  std::fill(o, o + B * hdp, 0.0f);
  std::fill(mx, mx + B, -INFINITY);
  std::fill(sum, sum + B, 0.0f);
  for (int64_t t0 = 0; t0 < n; t0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, n - t0);
    const float* keys = packed + t0 * hd;  // t0 is a whole number of panels
    const float* v = vals + t0 * hdp;
#if defined(__AVX512F__)
    const int64_t panels = key_panels(nk);
    for (int64_t p = 0; p < panels; ++p)  // a key panel stays in L1 across the row groups
      for (int64_t g = 0; g < groups; ++g)
        kScore[static_cast<size_t>(std::min(kQkRows, B - g * kQkRows) - 1)](
            qp + g * hd * kQkRows, keys + p * kKeyPanel * hd, hd, s + g * kQkRows * kKeyTile + p * kKeyPanel);
#elif defined(__AVX2__) && defined(__FMA__)
    const int64_t panels = key_panels(nk);
    for (int64_t p = 0; p < panels; ++p)  // a key panel stays in L1 across the row groups
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t h = 0; h < kKeyPanel; h += kQkKeys)
          for (int64_t r0 = g * kQkRows; r0 < std::min(B, (g + 1) * kQkRows); r0 += kQkSubRows)
            kScore[static_cast<size_t>(std::min(kQkSubRows, B - r0) - 1)](
                qp + g * hd * kQkRows + r0 % kQkRows, keys + p * kKeyPanel * hd + h, hd,
                s + r0 * kKeyTile + p * kKeyPanel + h);
#else
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < nk; ++j) {
        const float* panel = keys + j / kKeyPanel * kKeyPanel * hd + j % kKeyPanel;
        const float* qrow = qp + i / kQkRows * hd * kQkRows + i % kQkRows;
        float acc = 0.0f;
        for (int64_t d = 0; d < hd; ++d) acc = std::fma(qrow[d * kQkRows], panel[d * kKeyPanel], acc);
        s[i * kKeyTile + j] = acc;
      }
#endif
    for (int64_t i = 0; i < B; ++i) {
      float tile_sum;
      const float top = exp_scores(s + i * kKeyTile, nk, scale, mx[i], &tile_sum);
      const float alpha = std::exp(mx[i] - top);
      mx[i] = top;
      sum[i] = sum[i] * alpha + tile_sum;
      for (int64_t d = 0; d < hdp; ++d) o[i * hdp + d] *= alpha;
    }
#if defined(__AVX512F__)
    const int64_t chunks = hdp / 16;
    // Runs of kValueRun keys: the run's value columns stay in L1 across the row groups.
    for (int64_t c0 = 0; c0 < chunks; c0 += kPvChunks)
      for (int64_t j0 = 0; j0 < nk; j0 += kValueRun)
        for (int64_t r0 = 0; r0 < B; r0 += kPvRows) {
          const int64_t R = std::min(kPvRows, B - r0), C = std::min(kPvChunks, chunks - c0);
          kValues[static_cast<size_t>(R - 1)][static_cast<size_t>(C - 1)](
              s + r0 * kKeyTile + j0, v + j0 * hdp + 16 * c0, hdp, std::min(kValueRun, nk - j0), o + r0 * hdp + 16 * c0);
        }
#elif defined(__AVX2__) && defined(__FMA__)
    // Runs of kValueRun keys: the run's value columns stay in L1 across the row groups.
    for (int64_t c0 = 0; c0 < hdp; c0 += 8 * kPvChunks)
      for (int64_t j0 = 0; j0 < nk; j0 += kValueRun)
        for (int64_t r0 = 0; r0 < B; r0 += kPvRows)
          kValues[static_cast<size_t>(std::min(kPvRows, B - r0) - 1)](
              s + r0 * kKeyTile + j0, v + j0 * hdp + c0, hdp, std::min(kValueRun, nk - j0), o + r0 * hdp + c0);
#else
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < nk; ++j)
        for (int64_t d = 0; d < hd; ++d)
          o[i * hdp + d] = std::fma(s[i * kKeyTile + j], v[j * hdp + d], o[i * hdp + d]);
#endif
  }
  for (int64_t i = 0; i < B; ++i) {
    const float inv = 1.0f / sum[i];
    for (int64_t d = 0; d < hd; ++d) out[i * ldo + d] = o[i * hdp + d] * inv;
  }
}

}  // namespace kestrel::kernels
