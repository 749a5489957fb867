// TensorView: a non-owning, contiguous, row-major view of checkpoint bytes (usually inside an mmap).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace kestrel {

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? static_cast<int>(shape.size()) + i : i)); }
  int rank() const { return static_cast<int>(shape.size()); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
};

std::string shape_str(const std::vector<int64_t>& shape);

// Converts any float dtype (F32/F16/BF16/F8_E4M3) element range [begin, begin+n) to fp32.
void to_f32(const TensorView& t, int64_t begin, int64_t n, float* out);
// Whole tensor to a new fp32 vector.
std::vector<float> to_f32(const TensorView& t);

}  // namespace kestrel
