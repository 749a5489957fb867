// Scalar reference for the int8-activation kernels: natural element order, one int32 sum per scale
// group, no tricks. Every SIMD/AMX path is tested against this.
#include "kernels/cpu/w4a8_kernels.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {

void int8_rows_scalar(const Int8GemmTask& t, int64_t r0, int64_t r1) {
  const QuantizedActs& a = *t.acts;
  const int64_t in = t.in, G = t.kind == Int8Weights::kInt4 ? t.group : 32, groups = in / G;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wb = t.packed + r * (in / 2);
    for (int64_t n = 0; n < a.T; ++n) {
      const int8_t* x = a.q.data() + n * in;
      float acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t s = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          const int v = t.kind == Int8Weights::kInt4 ? int4_at(wb, k) : kMxfp4Twice[(wb[k >> 1] >> ((k & 1) * 4)) & 15];
          s += v * x[k];
        }
        float scale;
        if (t.kind == Int8Weights::kInt4) {
          uint16_t b;
          __builtin_memcpy(&b, t.scales + 2 * (r * groups + g), 2);
          scale = bf16_to_f32(b);
        } else {
          scale = 0.5f * e8m0_to_f32(t.scales[r * groups + g]);
        }
        acc += static_cast<float>(s) * scale;
      }
      t.y[n * t.ldy + r] = acc * a.scale[static_cast<size_t>(n)];
    }
  }
}

}  // namespace kestrel::kernels
