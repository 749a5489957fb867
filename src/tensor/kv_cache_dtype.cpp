#include "tensor/kv_cache_dtype.h"

namespace kestrel {

std::string_view kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kF32: return "fp32";
    case KvCacheDtype::kBF16: return "bf16";
    case KvCacheDtype::kFP8: return "fp8";
  }
  return "?";
}

std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view s) {
  for (KvCacheDtype d : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFP8})
    if (s == kv_cache_dtype_name(d)) return d;
  return std::nullopt;
}

int64_t kv_row_bytes(KvCacheDtype d, int64_t lora, int64_t rope) {
  switch (d) {
    case KvCacheDtype::kF32: return (lora + rope) * 4;
    case KvCacheDtype::kBF16: return (lora + rope) * 2;
    case KvCacheDtype::kFP8: return lora + 4 * ((lora + kKvFp8Tile - 1) / kKvFp8Tile) + 2 * rope;
  }
  return 0;
}

}  // namespace kestrel
