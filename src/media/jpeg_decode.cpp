// JPEG through the TurboJPEG API, which keeps libjpeg's setjmp error handling inside the library and writes
// messages into its own buffer, not stderr. Defaults match Pillow's (ISLOW DCT, fancy upsampling); pixels
// still differ from Pillow's by the libjpeg-turbo build (docs/vision.md §2.2).
#include <turbojpeg.h>

#include "media/decoders.h"

namespace kestrel::media::detail {
namespace {

struct TjGuard {
  tjhandle h;
  ~TjGuard() {
    if (h) tjDestroy(h);
  }
};

}  // namespace

Result<DecodedImage> decode_jpeg(std::span<const uint8_t> bytes, const HeaderCheck& check) {
  TjGuard tj{tjInitDecompress()};
  if (!tj.h) return Status(StatusCode::kInternal, "JPEG: decoder initialisation failed");
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  auto* data = const_cast<unsigned char*>(bytes.data());  // TurboJPEG 2.x takes non-const but does not write
  if (tjDecompressHeader3(tj.h, data, bytes.size(), &w, &h, &subsamp, &colorspace) != 0 || w <= 0 || h <= 0)
    return corrupt("JPEG: invalid or truncated header");
  DecodedImage img;
  img.format = ImageFormat::kJpeg;
  img.width = static_cast<uint32_t>(w);
  img.height = static_cast<uint32_t>(h);
  int pixel_format = TJPF_RGB;
  switch (colorspace) {
    case TJCS_GRAY:
      img.mode = PixelMode::kL;
      pixel_format = TJPF_GRAY;
      break;
    case TJCS_RGB:
    case TJCS_YCbCr: img.mode = PixelMode::kRGB; break;
    default: return unsupported("JPEG: CMYK/YCCK colour space is not supported");
  }
  KESTREL_RETURN_IF_ERROR(check(img));
  img.pixels.resize(img.row_bytes() * img.height);
  // A warning (truncated or corrupt data) is an error, as Pillow raises on a truncated file; progressive
  // files with an abusive number of scans are refused (CPU bomb).
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  if (tjDecompress2(tj.h, data, bytes.size(), img.pixels.data(), w, 0, h, pixel_format, flags) != 0)
    return corrupt("JPEG: invalid or truncated image data");
  return img;
}

}  // namespace kestrel::media::detail
