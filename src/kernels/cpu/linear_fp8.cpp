#include "kernels/cpu/linear_fp8.h"

#include <array>
#include <cstring>

#include "tensor/dtype.h"

namespace kestrel::kernels {
namespace {

// All 256 E4M3 codes decoded once (0x7f / 0xff are NaN, kept: a NaN weight should show up).
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) v[static_cast<size_t>(i)] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return v;
  }();
  return t;
}

}  // namespace

void decode_fp8_block_row(const WeightMatrix& w, int64_t r, float* dst) {
  const float* lut = e4m3_table().data();
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * w.in;
  const int64_t kb = fp8_blocks(w.in);
  // scale_inv may sit at any byte offset of the mmap: read each value with memcpy.
  const uint8_t* srow = w.scales + static_cast<size_t>((r / kFp8Block) * kb) * sizeof(float);
  for (int64_t b = 0; b < kb; ++b) {
    float s;
    std::memcpy(&s, srow + b * sizeof(float), sizeof(float));
    const int64_t j0 = b * kFp8Block, j1 = j0 + kFp8Block < w.in ? j0 + kFp8Block : w.in;
    for (int64_t j = j0; j < j1; ++j) dst[j] = lut[q[j]] * s;
  }
}

}  // namespace kestrel::kernels
