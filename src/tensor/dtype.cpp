#include "tensor/dtype.h"

#include <array>
#include <utility>

namespace kestrel {
namespace {
constexpr std::array<std::pair<DType, std::string_view>, 10> kNames = {{
    {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kU8, "U8"},
    {DType::kI8, "I8"}, {DType::kI32, "I32"}, {DType::kI64, "I64"}, {DType::kF8E4M3, "F8_E4M3"},
    {DType::kF64, "F64"}, {DType::kBool, "BOOL"},
}};
}  // namespace

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kU8: case DType::kI8: case DType::kF8E4M3: case DType::kBool: return 1;
    case DType::kI64: case DType::kF64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  for (const auto& [d, n] : kNames) if (d == t) return n;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& [d, n] : kNames) if (n == name) return d;
  return std::nullopt;
}

}  // namespace kestrel
