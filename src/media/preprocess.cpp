// Built with -ffp-contract=off (src/media/CMakeLists.txt): the composite and the normalisation reproduce
// numpy's float32/float64 operations one rounding at a time.
#include "media/preprocess.h"

#include <algorithm>
#include <cmath>

#include "media/pillow_resample.h"

namespace kestrel::media {
namespace {

uint8_t muldiv255(unsigned c, unsigned a) {  // round(c * a / 255), Pillow's premultiply
  const unsigned t = c * a + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

// Pillow resizes RGBA/LA premultiplied ("RGBa"/"La") and converts back with an integer division.
void premultiply(std::vector<uint8_t>& px, int ch) {
  for (size_t i = 0; i < px.size(); i += ch)
    for (int c = 0; c < ch - 1; ++c) px[i + c] = muldiv255(px[i + c], px[i + ch - 1]);
}
void unpremultiply(std::vector<uint8_t>& px, int ch) {
  for (size_t i = 0; i < px.size(); i += ch) {
    const unsigned a = px[i + ch - 1];
    if (a == 0 || a == 255) continue;
    for (int c = 0; c < ch - 1; ++c) px[i + c] = static_cast<uint8_t>(std::min(255u, 255u * px[i + c] / a));
  }
}

// Image.resize((w, h), BICUBIC) on the native mode (docs/vision.md §2.3). Returns the image's samples
// at the new size; L16 samples stay two bytes each.
std::vector<uint8_t> resize_native(const DecodedImage& img, int w, int h) {
  const int ch = channels(img.mode);
  const int iw = static_cast<int>(img.width), ih = static_cast<int>(img.height);
  if (w == iw && h == ih) return img.pixels;  // Pillow returns a copy without resampling
  if (img.nearest_only) return resize_nearest(img.pixels.data(), iw, ih, ch * bytes_per_sample(img.mode), w, h);
  if (img.mode == PixelMode::kL16) {
    std::vector<uint16_t> in(size_t(iw) * ih);
    std::copy_n(img.pixels.data(), in.size() * 2, reinterpret_cast<uint8_t*>(in.data()));
    const std::vector<uint16_t> out = resize_bicubic_u16(in.data(), iw, ih, w, h);
    std::vector<uint8_t> bytes(out.size() * 2);
    std::copy_n(reinterpret_cast<const uint8_t*>(out.data()), bytes.size(), bytes.data());
    return bytes;
  }
  const bool alpha = img.mode == PixelMode::kRGBA || img.mode == PixelMode::kLA;
  if (!alpha) return resize_bicubic_u8(img.pixels.data(), iw, ih, ch, w, h);
  std::vector<uint8_t> pre = img.pixels;
  premultiply(pre, ch);
  std::vector<uint8_t> out = resize_bicubic_u8(pre.data(), iw, ih, ch, w, h);
  unpremultiply(out, ch);
  return out;
}

// fill_transparent_bg_with after the resize: RGB stays; a mode without alpha or a transparency key is
// converted to RGB; otherwise RGBA is composited on the chessboard in float32 and truncated.
std::vector<uint8_t> to_rgb(const std::vector<uint8_t>& px, PixelMode mode, const DecodedImage& img, int w, int h,
                            const VisionPreprocessConfig& cfg) {
  const size_t n = size_t(w) * h;
  if (mode == PixelMode::kRGB) return px;
  std::vector<uint8_t> rgb(n * 3);
  if (mode == PixelMode::kL16) {  // Pillow's I;16 -> RGB clips to 255 (no scaling)
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::copy_n(&px[i * 2], 2, reinterpret_cast<uint8_t*>(&v));
      std::fill_n(&rgb[i * 3], 3, static_cast<uint8_t>(std::min<uint16_t>(v, 255)));
    }
    return rgb;
  }
  const bool has_alpha = mode == PixelMode::kRGBA || mode == PixelMode::kLA || img.has_gray_key;
  const int ch = channels(mode);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &px[i * ch];
    uint8_t r = p[0], g = p[0], b = p[0];
    if (mode == PixelMode::kRGBA) g = p[1], b = p[2];
    rgb[i * 3] = r, rgb[i * 3 + 1] = g, rgb[i * 3 + 2] = b;
  }
  if (!has_alpha) return rgb;
  const int sq = cfg.chessboard_square;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const size_t i = size_t(y) * w + x;
      const uint8_t* p = &px[i * ch];
      uint8_t a_u8 = 255;
      if (mode == PixelMode::kRGBA) a_u8 = p[3];
      else if (mode == PixelMode::kLA) a_u8 = p[1];
      else if (p[0] == img.gray_key) a_u8 = 0;
      const float bg = ((y / sq + x / sq) % 2 == 1) ? cfg.chessboard_gray : cfg.chessboard_white;
      const float a = static_cast<float>(a_u8) / 255.0f;
      for (int c = 0; c < 3; ++c) {
        const float v = a * static_cast<float>(rgb[i * 3 + c]) + (1.0f - a) * bg;
        rgb[i * 3 + c] = static_cast<uint8_t>(v);  // numpy astype(uint8): truncation; v is in [0, 256)
      }
    }
  }
  return rgb;
}

// normalize(): (x / 255.0) rounded to float32, then minus mean and times 1/std, each in float64 and
// rounded back to float32 (numpy's in-place ops on a float32 array with float64 operands).
std::array<std::array<float, 256>, 3> normalise_lut(const VisionPreprocessConfig& cfg) {
  std::array<std::array<float, 256>, 3> lut{};
  for (int c = 0; c < 3; ++c) {
    const double std_inv = 1.0 / cfg.image_std[c];
    for (int k = 0; k < 256; ++k) {
      float x = static_cast<float>(k / 255.0);
      x = static_cast<float>(static_cast<double>(x) - cfg.image_mean[c]);
      lut[c][k] = static_cast<float>(static_cast<double>(x) * std_inv);
    }
  }
  return lut;
}

}  // namespace

Result<NavitPlan> navit_plan(uint32_t width, uint32_t height, const VisionPreprocessConfig& cfg) {
  if (width == 0 || height == 0) return invalid_argument("image: empty image");
  const int p = cfg.patch_size;
  const double pw = std::max(1.0, static_cast<double>(width / p));
  const double ph = std::max(1.0, static_cast<double>(height / p));
  const double s1 = std::sqrt(static_cast<double>(cfg.in_patch_limit) / (pw * ph));
  const int side = cfg.patch_limit_on_one_side * p;
  const double s2 = static_cast<double>(side) / width;
  const double s3 = static_cast<double>(side) / height;
  const double scale = std::min({1.0, s1, s2, s3});
  NavitPlan plan;
  plan.new_width = std::min(side, std::max(1, static_cast<int>(width * scale)));  // int(): truncation
  plan.new_height = std::min(side, std::max(1, static_cast<int>(height * scale)));
  const int factor = cfg.merge_kernel_size * p;
  plan.pad_width = (factor - plan.new_width % factor) % factor;
  plan.pad_height = (factor - plan.new_height % factor) % factor;
  const int64_t th = (plan.new_height + plan.pad_height) / factor;
  const int64_t tw = (plan.new_width + plan.pad_width) / factor;
  if (th * cfg.merge_kernel_size > cfg.patch_limit_on_one_side ||
      tw * cfg.merge_kernel_size > cfg.patch_limit_on_one_side)
    return invalid_argument("image: " + std::to_string(width) + "x" + std::to_string(height) +
                            " exceeds the per-side patch limit after padding");
  plan.num_tokens = th * tw;
  return plan;
}

Result<PreprocessedImage> preprocess_image(const DecodedImage& image, const VisionPreprocessConfig& cfg) {
  const size_t expect = image.row_bytes() * image.height;
  if (image.pixels.size() != expect) return invalid_argument("image: pixel buffer does not match its size");
  Result<NavitPlan> plan = navit_plan(image.width, image.height, cfg);
  if (!plan) return plan.error();
  PreprocessedImage out;
  out.width = image.width;
  out.height = image.height;
  out.plan = *plan;
  const int w = plan->new_width, h = plan->new_height;
  out.rgb = to_rgb(resize_native(image, w, h), image.mode, image, w, h, cfg);

  const int p = cfg.patch_size;
  const int pw = w + plan->pad_width, ph = h + plan->pad_height;
  const int gh = ph / p, gw = pw / p;
  out.grid_thw = {1, gh, gw};
  const auto lut = normalise_lut(cfg);
  out.pixel_values.resize(size_t(gh) * gw * 3 * p * p);
  float* dst = out.pixel_values.data();
  for (int py = 0; py < gh; ++py)
    for (int px = 0; px < gw; ++px)
      for (int c = 0; c < 3; ++c)
        for (int y = py * p; y < (py + 1) * p; ++y)
          for (int x = px * p; x < (px + 1) * p; ++x) {
            const uint8_t v = (y < h && x < w) ? out.rgb[(size_t(y) * w + x) * 3 + c] : 0;  // zero pad
            *dst++ = lut[c][v];
          }
  return out;
}

std::string image_prompt(uint32_t width, uint32_t height) { return expanded_image_prompt(width, height, 1); }

std::string expanded_image_prompt(uint32_t width, uint32_t height, int64_t num_tokens) {
  std::string s = "<|media_begin|>image " + std::to_string(width) + "x" + std::to_string(height) + "<|media_content|>";
  for (int64_t i = 0; i < num_tokens; ++i) s += "<|media_pad|>";
  return s + "<|media_end|>";
}

}  // namespace kestrel::media
