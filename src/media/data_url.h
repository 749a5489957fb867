// Image URLs from a chat request: inline `data:image/...;base64,...` URLs (docs/vision.md §3.2). Any other URL is
// refused here; a server started with `--image-url-domains` hands non-data URLs to media/url_fetch instead (§3.3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace kestrel::media {

struct DataUrlLimits {
  size_t max_decoded_bytes = size_t{20} << 20;  // = ImageLimits::max_file_bytes; checked before decoding
};

struct DataUrl {
  std::string mime_type;  // lower-cased, e.g. "image/png"; the format itself is taken from the bytes
  std::vector<uint8_t> bytes;
};

Result<DataUrl> parse_image_url(std::string_view url, const DataUrlLimits& limits = {});

// Standard alphabet, '=' padding required (length a multiple of 4), no whitespace or other characters.
Result<std::vector<uint8_t>> base64_decode_strict(std::string_view text, size_t max_decoded_bytes);

}  // namespace kestrel::media
