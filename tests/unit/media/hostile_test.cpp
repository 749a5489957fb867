// Hostile image bytes: every case is a one-line error without a crash, and the size limits fire from the
// header, before a pixel buffer exists (the limits here are far below what a bomb would allocate).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <zlib.h>

#include "media/image_decode.h"
#include "media/preprocess.h"
#include "test_util.h"

namespace kestrel::media {
namespace {

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

void chunk(std::vector<uint8_t>& png, const char* type, const std::vector<uint8_t>& data) {
  put_be32(png, static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put_be32(png, static_cast<uint32_t>(crc32(0, png.data() + start, static_cast<uInt>(png.size() - start))));
}

// A valid PNG signature and IHDR claiming w x h RGB, plus a tiny IDAT: a decompression-bomb header.
std::vector<uint8_t> png_header(uint32_t w, uint32_t h) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_be32(ihdr, w);
  put_be32(ihdr, h);
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", {0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01});
  chunk(png, "IEND", {});
  return png;
}

void expect_clean_error(const Result<DecodedImage>& r) {
  ASSERT_FALSE(r);
  const std::string& m = r.error().message();
  EXPECT_FALSE(m.empty());
  EXPECT_EQ(m.find('\n'), std::string::npos);
  EXPECT_LT(m.size(), 200u);
}

TEST(VisionHostile, WrongMagicIsRefused) {
  for (std::string s : {"GIF89a\x01\x00\x01\x00", "BM\x00\x00\x00\x00", "", "\x89PNG", "RIFF\0\0\0\0WAVE"}) {
    const std::vector<uint8_t> b(s.begin(), s.end());
    Result<DecodedImage> r = decode_image(b);
    expect_clean_error(r);
  }
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0};
  Result<DecodedImage> r = decode_image(gif);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.error().message().find("PNG, JPEG, WebP"), std::string::npos);
}

TEST(VisionHostile, BombHeadersAreRefusedBeforeDecoding) {
  for (auto [w, h] : {std::pair<uint32_t, uint32_t>{50000, 50000}, {100000, 1}, {1, 100000}, {0x7fffffff, 0x7fffffff},
                      {7000, 7000}}) {
    SCOPED_TRACE(std::to_string(w) + "x" + std::to_string(h));
    Result<DecodedImage> r = decode_image(png_header(w, h));
    expect_clean_error(r);
    EXPECT_EQ(r.error().code(), StatusCode::kTooLarge) << r.error().message();
  }
  // Zero sizes are invalid PNGs.
  expect_clean_error(decode_image(png_header(0, 10)));
}

TEST(VisionHostile, LimitsAndBudgetAreChecked) {
  const std::vector<uint8_t> rgb = test::read_fixture("rgb.png");  // 61 x 47 RGB
  ImageLimits small;
  small.max_file_bytes = 100;
  Result<DecodedImage> r = decode_image(rgb, small);
  expect_clean_error(r);
  EXPECT_EQ(r.error().code(), StatusCode::kTooLarge);
  ImageLimits side;
  side.max_side = 60;
  expect_clean_error(decode_image(rgb, side));
  ImageLimits px;
  px.max_pixels = 61 * 47 - 1;
  expect_clean_error(decode_image(rgb, px));
  ImageLimits dec;
  dec.max_decoded_bytes = 61 * 47 * 3 - 1;
  expect_clean_error(decode_image(rgb, dec));
  dec.max_decoded_bytes = 61 * 47 * 3;
  EXPECT_TRUE(decode_image(rgb, dec));

  DecodeBudget budget{61 * 47 * 3 * 2};  // two decodes fit, the third does not
  EXPECT_TRUE(decode_image(rgb, {}, &budget));
  EXPECT_TRUE(decode_image(rgb, {}, &budget));
  Result<DecodedImage> third = decode_image(rgb, {}, &budget);
  expect_clean_error(third);
  EXPECT_NE(third.error().message().find("budget"), std::string::npos);
}

TEST(VisionHostile, TruncatedFilesFailCleanly) {
  for (const char* name : {"rgb.png", "palette_trns.png", "gray16.png", "photo.jpg", "photo.webp",
                           "rgba_lossless.webp"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> full = test::read_fixture(name);
    const std::string n = name;
    // A PNG may lose its IEND chunk (Pillow reads such files too); everything before it must fail.
    const size_t must_fail_below = n.ends_with(".png") ? full.size() - 12 : full.size() - 1;
    for (size_t len = 0; len < full.size(); len += (len < 64 ? 1 : 7)) {
      const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      Result<DecodedImage> r = decode_image(cut);
      if (len < must_fail_below) {
        SCOPED_TRACE(len);
        expect_clean_error(r);
      }
      if (r) {
        EXPECT_TRUE(preprocess_image(*r));
      }
    }
  }
}

TEST(VisionHostile, CorruptedBytesNeverCrash) {
  // Flip bytes through the files: each decode either fails with a clean error or yields a well-formed image.
  for (const char* name : {"rgba_partial.png", "photo.jpg", "photo.webp"}) {
    std::vector<uint8_t> b = test::read_fixture(name);
    for (size_t i = 8; i < b.size(); i += 13) {
      std::vector<uint8_t> c = b;
      c[i] ^= 0x5a;
      Result<DecodedImage> r = decode_image(c);
      if (r) {
        EXPECT_EQ(r->pixels.size(), r->row_bytes() * r->height);
      } else {
        expect_clean_error(r);
      }
    }
  }
}

}  // namespace
}  // namespace kestrel::media
