#include "tensor/tensor.h"

#include "base/check.h"

namespace kestrel {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

void to_f32(const TensorView& t, int64_t begin, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::kF32: {
      const float* p = t.as<float>() + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = t.as<uint16_t>() + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* p = t.as<uint16_t>() + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* p = t.as<uint8_t>() + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(p[i]);
      return;
    }
    default:
      panic("to_f32 on a non-float tensor");
  }
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  to_f32(t, 0, t.numel(), v.data());
  return v;
}

}  // namespace kestrel
