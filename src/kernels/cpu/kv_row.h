// One cached MLA latent row in its page dtype (tensor/kv_cache_dtype.h): the write path's quantizer
// and the readers' decoder. Readers decode a row on load into a small fp32 buffer and run the same
// fp32 arithmetic on it whatever the dtype; fp32 rows are read in place (no copy, bit for bit today's).
#pragma once

#include <cstdint>

#include "tensor/kv_cache_dtype.h"

namespace kestrel::kernels {

struct KvRowFormat {
  KvCacheDtype dtype = KvCacheDtype::kF32;
  int64_t lora = 0, rope = 0;  // latent and positional elements of the row
  int64_t elems() const { return lora + rope; }
  int64_t bytes() const { return kv_row_bytes(dtype, lora, rope); }
};

// Stores x[0, lora + rope) as one row at dst (f.bytes() bytes). fp32: the floats as they are; bf16:
// round-to-nearest-even; fp8: each 128-element latent tile quantized like DeepSeek's act_quant
// (scale = max(amax, 1e-4) / 448, codes = e4m3(x / scale)), the rope part in bf16.
void kv_store_row(const KvRowFormat& f, const float* x, uint8_t* dst);
// Decodes elements [0, n) of a stored row into out (n ≤ lora + rope).
void kv_load_row(const KvRowFormat& f, const uint8_t* row, int64_t n, float* out);
// Decodes latent elements [begin, begin + n) of a stored row into out (begin + n ≤ lora): the values kv_load_row
// gives at those positions.
void kv_load_range(const KvRowFormat& f, const uint8_t* row, int64_t begin, int64_t n, float* out);
// The row's first n elements as fp32: the row itself when it is fp32, else decoded into buf (≥ n floats).
inline const float* kv_row_floats(const KvRowFormat& f, const uint8_t* row, int64_t n, float* buf) {
  if (f.dtype == KvCacheDtype::kF32) return reinterpret_cast<const float*>(row);
  kv_load_row(f, row, n, buf);
  return buf;
}

}  // namespace kestrel::kernels
