// Element type of the MLA latent cache pages (`--kv-cache-dtype`) and the bytes of one cached row
// [c_kv (lora) | k_r (rope)]. Layouts (docs/architecture.md, "MLA cache dtype"):
//   fp32: (lora + rope) × fp32 — the exact default;
//   bf16: (lora + rope) × bf16, round-to-nearest-even;
//   fp8:  [lora × e4m3 | ceil(lora / 128) × fp32 scale | rope × bf16] — FlashMLA's / vLLM's fp8_ds_mla
//         row (656 B for 512 + 64): the latent in e4m3 with one scale per 128-element tile, the rope part
//         kept in bf16.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kestrel {

enum class KvCacheDtype { kF32, kBF16, kFP8 };

// Latent elements sharing one fp8 scale.
inline constexpr int64_t kKvFp8Tile = 128;

std::string_view kv_cache_dtype_name(KvCacheDtype d);  // "fp32", "bf16", "fp8"
std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view s);

// Bytes of one cached row of `lora` latent and `rope` positional elements.
int64_t kv_row_bytes(KvCacheDtype d, int64_t lora, int64_t rope);

}  // namespace kestrel
