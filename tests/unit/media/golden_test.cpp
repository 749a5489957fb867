// Preprocessing vs tools/gen_vision_goldens.py (the reference processor's steps over Pillow + numpy):
// every lossless fixture bit for bit (decoded samples, resized+composited uint8, float32 pixel_values,
// grid, token count, prompt); lossy JPEG/WebP within a tolerance, because the pixels come from a different
// libjpeg-turbo / libwebp build than Pillow's wheel bundles (docs/vision.md §2.2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "media/image_decode.h"
#include "media/preprocess.h"
#include "test_util.h"

namespace kestrel::media {
namespace {

using nlohmann::json;

const json& goldens() {
  static const json j = [] {
    const std::vector<uint8_t> b = test::read_fixture("goldens.json");
    return json::parse(b.begin(), b.end());
  }();
  return j;
}

VisionPreprocessConfig config_from(const json& c) {
  VisionPreprocessConfig cfg;
  cfg.patch_size = c.at("patch_size");
  cfg.merge_kernel_size = c.at("merge_kernel_size");
  cfg.in_patch_limit = c.at("in_patch_limit");
  cfg.patch_limit_on_one_side = c.at("patch_limit_on_one_side");
  for (int i = 0; i < 3; ++i) cfg.image_mean[i] = c.at("image_mean")[i], cfg.image_std[i] = c.at("image_std")[i];
  cfg.chessboard_square = c.at("chessboard_square_size");
  cfg.chessboard_white = c.at("chessboard_white_value");
  cfg.chessboard_gray = c.at("chessboard_gray_value");
  return cfg;
}

std::vector<uint8_t> from_hex(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

TEST(VisionGolden, MetadataSaysTranscription) {
  const json& m = goldens().at("metadata");
  EXPECT_NE(m.at("reference_kind").get<std::string>().find("transcribed"), std::string::npos);
  EXPECT_EQ(m.at("transcription_sha256").get<std::string>().size(), 64u);
  EXPECT_GE(goldens().at("cases").size(), 15u);
}

TEST(VisionGolden, EveryFixtureMatchesTheReference) {
  const json& cases = goldens().at("cases");
  int exact_cases = 0;
  for (const json& c : cases) {
    const std::string file = c.at("file");
    SCOPED_TRACE(file);
    const bool exact = c.at("exact");
    Result<DecodedImage> img = decode_image(test::read_fixture(file));
    ASSERT_TRUE(img) << img.error().message();
    EXPECT_EQ(img->width, c.at("width").get<uint32_t>());  // stored size: EXIF orientation is ignored
    EXPECT_EQ(img->height, c.at("height").get<uint32_t>());
    if (exact) {
      EXPECT_EQ(test::sha256_hex(img->pixels.data(), img->pixels.size()), c.at("decoded_sha256"));
    }
    for (const auto& [cfg_name, g] : c.at("configs").items()) {
      SCOPED_TRACE(cfg_name);
      const VisionPreprocessConfig cfg = config_from(goldens().at("metadata").at("configs").at(cfg_name));
      Result<PreprocessedImage> p = preprocess_image(*img, cfg);
      ASSERT_TRUE(p) << p.error().message();
      EXPECT_EQ(p->plan.new_width, g.at("new_width").get<int>());
      EXPECT_EQ(p->plan.new_height, g.at("new_height").get<int>());
      EXPECT_EQ(p->plan.pad_width, g.at("pad_width").get<int>());
      EXPECT_EQ(p->plan.pad_height, g.at("pad_height").get<int>());
      EXPECT_EQ(p->plan.num_tokens, g.at("num_tokens").get<int64_t>());
      EXPECT_EQ(p->grid_thw[0], g.at("grid_thw")[0].get<int64_t>());
      EXPECT_EQ(p->grid_thw[1], g.at("grid_thw")[1].get<int64_t>());
      EXPECT_EQ(p->grid_thw[2], g.at("grid_thw")[2].get<int64_t>());
      EXPECT_EQ(p->num_patches() * 3 * cfg.patch_size * cfg.patch_size, int64_t(p->pixel_values.size()));
      EXPECT_EQ(p->num_patches(), p->plan.num_tokens * 4);  // 2x2 merge
      EXPECT_EQ(image_prompt(p->width, p->height), g.at("prompt").get<std::string>());
      if (exact) {
        EXPECT_EQ(test::sha256_hex(p->rgb.data(), p->rgb.size()), g.at("rgb_sha256"));
        EXPECT_EQ(test::sha256_hex(p->pixel_values.data(), p->pixel_values.size() * 4), g.at("pixel_values_sha256"));
        ++exact_cases;
      } else {
        // Lossy decoders: every resized uint8 sample within 2 levels and the mean within 0.5 level.
        const std::vector<uint8_t> want = from_hex(g.at("rgb_hex"));
        ASSERT_EQ(want.size(), p->rgb.size());
        int max_diff = 0;
        double sum = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const int d = std::abs(int(want[i]) - int(p->rgb[i]));
          max_diff = std::max(max_diff, d);
          sum += d;
        }
        RecordProperty(file + "_" + cfg_name + "_max_diff", max_diff);
        EXPECT_LE(max_diff, 2);
        EXPECT_LE(sum / double(want.size()), 0.5);
      }
    }
  }
  EXPECT_GE(exact_cases, 30);
}

TEST(VisionGolden, ExpandedPromptRepeatsThePad) {
  EXPECT_EQ(expanded_image_prompt(640, 480, 3),
            "<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_pad|><|media_pad|><|media_end|>");
}

// The navit size rule at the published worst case and the per-side clamp (arithmetic only).
TEST(VisionGolden, NavitPlanLimits) {
  Result<NavitPlan> worst = navit_plan(1861, 7041);
  ASSERT_TRUE(worst);
  EXPECT_EQ(worst->new_width, 1850);
  EXPECT_EQ(worst->new_height, 7002);
  EXPECT_EQ(worst->num_tokens, 16817);
  Result<NavitPlan> big = navit_plan(1024, 1024);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->num_tokens, 1369);
  Result<NavitPlan> thin = navit_plan(100000, 1);
  ASSERT_TRUE(thin);
  EXPECT_EQ(thin->new_width, 7167);  // 100000 * (7168 / 100000.0) = 7167.999..., truncated
  EXPECT_EQ(thin->new_height, 1);
}

}  // namespace
}  // namespace kestrel::media
