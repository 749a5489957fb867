// Format allow-list, limits and the decoded-bytes budget around the per-format decoders.
#include "media/image_decode.h"

#include <cstring>
#include <string>

#include "media/decoders.h"

namespace kestrel::media {

const char* format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kWebp: return "WebP";
  }
  return "?";
}

int channels(PixelMode m) {
  switch (m) {
    case PixelMode::kL:
    case PixelMode::kL16: return 1;
    case PixelMode::kLA: return 2;
    case PixelMode::kRGB: return 3;
    case PixelMode::kRGBA: return 4;
  }
  return 0;
}

int bytes_per_sample(PixelMode m) { return m == PixelMode::kL16 ? 2 : 1; }

Result<ImageFormat> sniff_format(std::span<const uint8_t> b) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return ImageFormat::kPng;
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::kJpeg;
  if (b.size() >= 12 && std::memcmp(b.data(), "RIFF", 4) == 0 && std::memcmp(b.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::kWebp;
  return unsupported("image: unrecognised format (accepted: PNG, JPEG, WebP)");
}

namespace {

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

Status check_size(ImageFormat f, uint64_t w, uint64_t h, const ImageLimits& limits) {
  const std::string fmt = format_name(f);
  if (w > limits.max_side || h > limits.max_side)
    return too_large(fmt + ": image is " + std::to_string(w) + "x" + std::to_string(h) + ", over the " +
                     std::to_string(limits.max_side) + "-pixel side limit");
  if (w * h > limits.max_pixels)
    return too_large(fmt + ": image has " + std::to_string(w * h) + " pixels, over the limit of " +
                     std::to_string(limits.max_pixels));
  return Status::ok();
}

// The IHDR of a PNG, read by hand so that a bomb header is refused before libpng sees the file.
Status precheck_png(std::span<const uint8_t> b, const ImageLimits& limits) {
  if (b.size() < 24 || std::memcmp(b.data() + 12, "IHDR", 4) != 0) return corrupt("PNG: invalid or truncated header");
  return check_size(ImageFormat::kPng, be32(b.data() + 16), be32(b.data() + 20), limits);
}

}  // namespace

Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits, DecodeBudget* budget) {
  if (bytes.size() > limits.max_file_bytes)
    return too_large("image: " + std::to_string(bytes.size()) + " bytes, over the limit of " +
                     std::to_string(limits.max_file_bytes));
  Result<ImageFormat> format = sniff_format(bytes);
  if (!format) return format.error();
  if (*format == ImageFormat::kPng) KESTREL_RETURN_IF_ERROR(precheck_png(bytes, limits));

  // Runs inside the decoder once the header is parsed, before the pixel buffer exists.
  auto check = [&](const DecodedImage& h) -> Status {
    KESTREL_RETURN_IF_ERROR(check_size(h.format, h.width, h.height, limits));
    const uint64_t need = uint64_t{h.width} * h.height * channels(h.mode) * bytes_per_sample(h.mode);
    const std::string fmt = format_name(h.format);
    if (need > limits.max_decoded_bytes)
      return too_large(fmt + ": decoded image would take " + std::to_string(need) + " bytes, over the limit of " +
                       std::to_string(limits.max_decoded_bytes));
    if (budget) {
      if (need > budget->remaining_bytes)
        return too_large(fmt + ": decoded image would take " + std::to_string(need) +
                         " bytes, over the remaining decode budget of " + std::to_string(budget->remaining_bytes));
      budget->remaining_bytes -= need;
    }
    return Status::ok();
  };
  switch (*format) {
    case ImageFormat::kPng: return detail::decode_png(bytes, check);
    case ImageFormat::kJpeg: return detail::decode_jpeg(bytes, check);
    case ImageFormat::kWebp: return detail::decode_webp(bytes, check);
  }
  return Status(StatusCode::kInternal, "image: unknown format");
}

}  // namespace kestrel::media
