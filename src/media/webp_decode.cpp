// WebP through libwebp's simple decoding API (no callbacks, no global state). Animated files are refused.
#include <webp/decode.h>

#include "media/decoders.h"

namespace kestrel::media::detail {

Result<DecodedImage> decode_webp(std::span<const uint8_t> bytes, const HeaderCheck& check) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(bytes.data(), bytes.size(), &f) != VP8_STATUS_OK || f.width <= 0 || f.height <= 0)
    return corrupt("WebP: invalid or truncated header");
  if (f.has_animation) return unsupported("WebP: animated images are not supported");
  DecodedImage img;
  img.format = ImageFormat::kWebp;
  img.width = static_cast<uint32_t>(f.width);
  img.height = static_cast<uint32_t>(f.height);
  img.mode = f.has_alpha ? PixelMode::kRGBA : PixelMode::kRGB;  // Pillow's mode for the same file
  KESTREL_RETURN_IF_ERROR(check(img));
  img.pixels.resize(img.row_bytes() * img.height);
  const int stride = static_cast<int>(img.row_bytes());
  const uint8_t* ok = f.has_alpha
                          ? WebPDecodeRGBAInto(bytes.data(), bytes.size(), img.pixels.data(), img.pixels.size(), stride)
                          : WebPDecodeRGBInto(bytes.data(), bytes.size(), img.pixels.data(), img.pixels.size(), stride);
  if (!ok) return corrupt("WebP: invalid or truncated image data");
  return img;
}

}  // namespace kestrel::media::detail
