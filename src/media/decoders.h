// Per-format decoders behind decode_image (image_decode.cpp). Internal to kestrel_media.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "media/image_decode.h"

namespace kestrel::media::detail {

// Called by a decoder once it knows the size and mode, before it allocates the pixel buffer: checks the
// limits and charges the budget (image_decode.cpp).
using HeaderCheck = std::function<Status(const DecodedImage& header)>;

Result<DecodedImage> decode_png(std::span<const uint8_t> bytes, const HeaderCheck& check);
Result<DecodedImage> decode_jpeg(std::span<const uint8_t> bytes, const HeaderCheck& check);
Result<DecodedImage> decode_webp(std::span<const uint8_t> bytes, const HeaderCheck& check);

}  // namespace kestrel::media::detail
