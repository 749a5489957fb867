// PNG through libpng's progressive-free read API. libpng reports errors by longjmp, so every libpng call
// that can fail runs inside a plain C-style function (no C++ object with a destructor in its frame) that
// holds the setjmp; the C++ caller owns the buffers and the png_struct. Warnings are dropped and errors
// are never printed or forwarded: the caller gets a fixed message (docs/vision.md §3).
#include <png.h>

#include <bit>
#include <csetjmp>
#include <cstring>

#include "media/decoders.h"

namespace kestrel::media::detail {
namespace {

// Plain data shared with the setjmp functions.
struct PngSession {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  // Filled by read_header.
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  bool has_trns = false;
  png_uint_16 trns_gray = 0;
  size_t rowbytes = 0;
};

void read_cb(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngSession*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) png_error(png, "truncated");  // longjmps to the active setjmp
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}
[[noreturn]] void error_cb(png_structp png, png_const_charp) { png_longjmp(png, 1); }
void warning_cb(png_structp, png_const_charp) {}

// Reads the chunks before the image data and sets the transforms that give Pillow's layout for the mode
// (docs/vision.md §2.1). Returns false on any libpng error.
bool read_header(PngSession* s, png_uint_32 max_side) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_read_fn(s->png, s, read_cb);
  png_set_user_limits(s->png, max_side, max_side);
  png_set_chunk_malloc_max(s->png, png_alloc_size_t{8} << 20);  // ancillary chunks (iCCP, zTXt) capped
  png_set_chunk_cache_max(s->png, 1000);
  png_read_info(s->png, s->info);
  s->width = png_get_image_width(s->png, s->info);
  s->height = png_get_image_height(s->png, s->info);
  s->bit_depth = png_get_bit_depth(s->png, s->info);
  s->color_type = png_get_color_type(s->png, s->info);
  s->has_trns = png_get_valid(s->png, s->info, PNG_INFO_tRNS) != 0;
  if (s->has_trns && s->color_type == PNG_COLOR_TYPE_GRAY) {
    png_color_16p c = nullptr;
    png_get_tRNS(s->png, s->info, nullptr, nullptr, &c);
    s->trns_gray = c ? c->gray : 0;
  }
  if (s->color_type == PNG_COLOR_TYPE_PALETTE) {
    png_set_palette_to_rgb(s->png);
    if (s->has_trns) png_set_tRNS_to_alpha(s->png);  // per-entry alpha, like Pillow's P -> RGBA
  } else if (s->color_type == PNG_COLOR_TYPE_GRAY && s->bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(s->png);  // scaled (x255, x85, x17) like Pillow's "1"/"L;2"/"L;4"
  }
  if (s->bit_depth == 16) {
    if (s->color_type == PNG_COLOR_TYPE_GRAY) {
      if (std::endian::native == std::endian::little) png_set_swap(s->png);  // kept 16-bit ("I;16"), host order
    } else {
      png_set_strip_16(s->png);  // high byte, as Pillow's "RGB;16B"/"RGBA;16B"/"LA;16B" unpackers
    }
  }
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  s->rowbytes = png_get_rowbytes(s->png, s->info);
  return true;
}

bool read_pixels(PngSession* s, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_image(s->png, rows);  // consumes the last IDAT's CRC; a truncation before IEND fails here
  return true;
}

struct SessionGuard {
  PngSession* s;
  ~SessionGuard() { png_destroy_read_struct(&s->png, s->info ? &s->info : nullptr, nullptr); }
};

}  // namespace

Result<DecodedImage> decode_png(std::span<const uint8_t> bytes, const HeaderCheck& check) {
  PngSession s;
  s.data = bytes.data();
  s.size = bytes.size();
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, error_cb, warning_cb);
  if (!s.png) return Status(StatusCode::kInternal, "PNG: decoder initialisation failed");
  SessionGuard guard{&s};
  s.info = png_create_info_struct(s.png);
  if (!s.info) return Status(StatusCode::kInternal, "PNG: decoder initialisation failed");
  if (!read_header(&s, PNG_USER_WIDTH_MAX)) return corrupt("PNG: invalid or truncated header");

  DecodedImage img;
  img.format = ImageFormat::kPng;
  img.width = s.width;
  img.height = s.height;
  switch (s.color_type) {
    case PNG_COLOR_TYPE_PALETTE:
      img.mode = s.has_trns ? PixelMode::kRGBA : PixelMode::kRGB;
      img.nearest_only = true;
      break;
    case PNG_COLOR_TYPE_GRAY:
      img.mode = s.bit_depth == 16 ? PixelMode::kL16 : PixelMode::kL;
      img.nearest_only = s.bit_depth == 1;
      if (s.has_trns) {
        // Pillow keeps a key on "I;16" and on unscaled 1/2/4-bit samples; neither is reproduced here.
        if (s.bit_depth != 8) return unsupported("PNG: greyscale transparency key on a non-8-bit image");
        img.has_gray_key = true;
        img.gray_key = static_cast<uint8_t>(s.trns_gray);
      }
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA: img.mode = PixelMode::kLA; break;
    case PNG_COLOR_TYPE_RGB: img.mode = PixelMode::kRGB; break;  // a tRNS colour key is ignored, as the reference does
    case PNG_COLOR_TYPE_RGB_ALPHA: img.mode = PixelMode::kRGBA; break;
    default: return corrupt("PNG: invalid colour type");
  }
  if (s.rowbytes != img.row_bytes()) return Status(StatusCode::kInternal, "PNG: unexpected row layout");
  KESTREL_RETURN_IF_ERROR(check(img));
  img.pixels.resize(img.row_bytes() * img.height);
  std::vector<png_bytep> rows(img.height);
  for (uint32_t y = 0; y < img.height; ++y) rows[y] = img.pixels.data() + size_t{y} * img.row_bytes();
  if (!read_pixels(&s, rows.data())) return corrupt("PNG: invalid or truncated image data");
  return img;
}

}  // namespace kestrel::media::detail
