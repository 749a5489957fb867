#include "kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/scratch.h"

namespace kestrel::kernels {
namespace {

// Dot of fp32 vectors with 8 independent accumulators (vectorises under -O3).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void decode_row(const WeightMatrix& w, int64_t r, float* dst) {
  const int64_t n = w.in;
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* p = static_cast<const float*>(w.data) + r * n;
      std::copy(p, p + n, dst);
      return;
    }
    case WeightFormat::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (n / 2);
      const uint8_t* s = w.scales + r * (n / 32);
      for (int64_t b = 0; b < n / 32; ++b) {
        const float scale = e8m0_to_f32(s[b]);
        for (int64_t j = 0; j < 16; ++j) {
          const uint8_t byte = p[b * 16 + j];
          dst[b * 32 + 2 * j] = kE2M1Values[byte & 0xf] * scale;
          dst[b * 32 + 2 * j + 1] = kE2M1Values[byte >> 4] * scale;
        }
      }
      return;
    }
  }
}

void matmul(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  KCHECK(w.format != WeightFormat::kMxfp4 || (w.in % 32 == 0 && w.scales != nullptr), "bad MXFP4 matrix");
  const int64_t out = w.out, in = w.in;
  if (w.format == WeightFormat::kF32) {
    const float* W = static_cast<const float*>(w.data);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < out; ++r)
      for (int64_t t = 0; t < T; ++t) y[t * out + r] = dot(W + r * in, x + t * in, in);
    return;
  }
  // Decode a block of rows once per thread, then use it for every token: weights are read once.
  constexpr int64_t kRows = 8;
  const int64_t blocks = (out + kRows - 1) / kRows;
#pragma omp parallel
  {
    float* buf = thread_scratch(kScratchLinear, static_cast<size_t>(kRows * in));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRows, r1 = std::min(out, r0 + kRows);
      for (int64_t r = r0; r < r1; ++r) decode_row(w, r, buf + (r - r0) * in);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * in;
        for (int64_t r = r0; r < r1; ++r) y[t * out + r] = dot(buf + (r - r0) * in, xt, in);
      }
    }
  }
}

void matmul_reference(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  std::vector<float> row(static_cast<size_t>(w.in));
  for (int64_t r = 0; r < w.out; ++r) {
    decode_row(w, r, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t i = 0; i < w.in; ++i) s += static_cast<double>(row[static_cast<size_t>(i)]) * x[t * w.in + i];
      y[t * w.out + r] = static_cast<float>(s);
    }
  }
}

}  // namespace kestrel::kernels
