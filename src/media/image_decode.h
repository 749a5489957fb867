// Untrusted image bytes -> pixels, behind limits that are checked from the header before any pixel buffer
// is allocated (docs/vision.md §3). Pixels keep the layout Pillow gives the same file (docs/vision.md §2), so
// that preprocess.h can apply Pillow's per-mode resize rules to them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel::media {

enum class ImageFormat { kPng, kJpeg, kWebp };
const char* format_name(ImageFormat f);

// The Pillow mode the pixels stand for. Samples are interleaved, 8 bits except kL16.
enum class PixelMode {
  kL,     // 1 channel
  kLA,    // 2 channels: grey, alpha
  kRGB,   // 3 channels
  kRGBA,  // 4 channels (also palette images with transparency, expanded)
  kL16,   // 1 channel, uint16 native-endian (Pillow "I;16": 16-bit greyscale PNG)
};
int channels(PixelMode m);
int bytes_per_sample(PixelMode m);

// Defaults are Kestrel's own (the reference has none but Pillow's bomb check): docs/vision.md §3.
struct ImageLimits {
  size_t max_file_bytes = size_t{20} << 20;     // encoded bytes per image
  uint32_t max_side = 16384;                    // width and height, from the header
  uint64_t max_pixels = 40'000'000;             // width x height, from the header
  uint64_t max_decoded_bytes = uint64_t{160} << 20;  // decoded buffer of one image
};

// Decoded bytes allowed across several images (one request); each decode charges its buffer before
// allocating it and fails when the remainder does not cover it.
struct DecodeBudget {
  uint64_t remaining_bytes = uint64_t{512} << 20;
};

struct DecodedImage {
  ImageFormat format = ImageFormat::kPng;
  uint32_t width = 0;
  uint32_t height = 0;
  PixelMode mode = PixelMode::kRGB;
  // Pillow resizes modes "P" and "1" with NEAREST whatever filter is asked (docs/vision.md §2.3): set for
  // palette PNGs (expanded here to RGB/RGBA) and 1-bit greyscale PNGs.
  bool nearest_only = false;
  // A PNG tRNS grey key on an 8-bit kL image: Pillow keeps it as info["transparency"] and the reference
  // composites pixels equal to it as fully transparent after the resize.
  bool has_gray_key = false;
  uint8_t gray_key = 0;
  std::vector<uint8_t> pixels;  // height rows of width * channels * bytes_per_sample bytes

  size_t row_bytes() const { return size_t{width} * channels(mode) * bytes_per_sample(mode); }
};

// Format from the magic bytes; PNG, JPEG and WebP only (everything else is refused).
Result<ImageFormat> sniff_format(std::span<const uint8_t> bytes);

// Decodes one image. Errors are one line, name the format and the limit, and never carry decoder text.
// budget may be null (no cross-image budget).
Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits = {},
                                  DecodeBudget* budget = nullptr);

}  // namespace kestrel::media
