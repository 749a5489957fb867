#include "kernels/cpu/kv_row.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/fp8_e4m3.h"
#include "tensor/dtype.h"

namespace kestrel::kernels {

namespace {

void store_bf16(const float* x, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

// bf16 → fp32 is the 16-bit shift; a plain loop GCC vectorizes.
void load_bf16(const uint8_t* src, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    out[i] = bf16_to_f32(h);
  }
}

int64_t fp8_tiles(int64_t lora) { return (lora + kKvFp8Tile - 1) / kKvFp8Tile; }

}  // namespace

void kv_store_row(const KvRowFormat& f, const float* x, uint8_t* dst) {
  switch (f.dtype) {
    case KvCacheDtype::kF32:
      std::memcpy(dst, x, static_cast<size_t>(f.elems()) * 4);
      return;
    case KvCacheDtype::kBF16:
      store_bf16(x, f.elems(), dst);
      return;
    case KvCacheDtype::kFP8: {
      uint8_t* scales = dst + f.lora;
      for (int64_t t = 0; t < fp8_tiles(f.lora); ++t) {
        const int64_t b = t * kKvFp8Tile, n = std::min(kKvFp8Tile, f.lora - b);
        const float s = quantize_e4m3_block(x + b, n, /*ue8m0=*/false, dst + b);
        std::memcpy(scales + 4 * t, &s, 4);
      }
      store_bf16(x + f.lora, f.rope, scales + 4 * fp8_tiles(f.lora));
      return;
    }
  }
}

void kv_load_row(const KvRowFormat& f, const uint8_t* row, int64_t n, float* out) {
  switch (f.dtype) {
    case KvCacheDtype::kF32:
      std::memcpy(out, row, static_cast<size_t>(n) * 4);
      return;
    case KvCacheDtype::kBF16:
      load_bf16(row, n, out);
      return;
    case KvCacheDtype::kFP8: {
      const uint8_t* scales = row + f.lora;
      const int64_t lat = std::min(n, f.lora);
      decode_e4m3(row, out, lat);
      for (int64_t t = 0; t * kKvFp8Tile < lat; ++t) {
        float s;
        std::memcpy(&s, scales + 4 * t, 4);
        float* o = out + t * kKvFp8Tile;
        const int64_t m = std::min(kKvFp8Tile, lat - t * kKvFp8Tile);
        for (int64_t i = 0; i < m; ++i) o[i] *= s;
      }
      if (n > f.lora) load_bf16(scales + 4 * fp8_tiles(f.lora), n - f.lora, out + f.lora);
      return;
    }
  }
}

void kv_load_range(const KvRowFormat& f, const uint8_t* row, int64_t begin, int64_t n, float* out) {
  switch (f.dtype) {
    case KvCacheDtype::kF32:
      std::memcpy(out, row + 4 * begin, static_cast<size_t>(n) * 4);
      return;
    case KvCacheDtype::kBF16:
      load_bf16(row + 2 * begin, n, out);
      return;
    case KvCacheDtype::kFP8: {
      const uint8_t* scales = row + f.lora;
      decode_e4m3(row + begin, out, n);
      for (int64_t i = 0; i < n;) {  // one scale per 128-element tile
        const int64_t t = (begin + i) / kKvFp8Tile, end = std::min(n, (t + 1) * kKvFp8Tile - begin);
        float s;
        std::memcpy(&s, scales + 4 * t, 4);
        for (; i < end; ++i) out[i] *= s;
      }
      return;
    }
  }
}

}  // namespace kestrel::kernels
