// Untrusted image input end to end: data-URL parse (when the input starts with "data:"), decode behind
// limits, and the reference preprocessing with a small patch budget so that the resize runs too.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "media/data_url.h"
#include "media/image_decode.h"
#include "media/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel::media;
  using kestrel::Result;
  std::span<const uint8_t> bytes(data, size);
  DataUrl url;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (text.starts_with("data:")) {
    Result<DataUrl> r = parse_image_url(text, DataUrlLimits{1 << 20});
    if (!r) return 0;
    url = std::move(*r);
    bytes = url.bytes;
  }
  ImageLimits limits;  // small enough for the fuzzer's memory limit
  limits.max_side = 4096;
  limits.max_pixels = 1 << 20;
  limits.max_decoded_bytes = 8 << 20;
  Result<DecodedImage> img = decode_image(bytes, limits);
  if (!img) return 0;
  VisionPreprocessConfig cfg;
  cfg.in_patch_limit = 16;
  Result<PreprocessedImage> p = preprocess_image(*img, cfg);
  if (p && p->pixel_values.size() != size_t(p->num_patches()) * 3 * 14 * 14) __builtin_trap();
  return 0;
}
