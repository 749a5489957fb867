// The Kimi K3 reference image processor, step for step (docs/vision.md §1-§2): NaViT size rule, Pillow's
// per-mode BICUBIC resize, chessboard composite of transparency AFTER the resize, zero pad to multiples of
// 28, normalisation to [-1, 1], 14x14 patches in raster order. Output is bit-identical to the reference
// for the same decoded pixels (tests/unit/media).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "media/image_decode.h"

namespace kestrel::media {

// The checkpoint's preprocessor_config values (docs/vision.md §1).
struct VisionPreprocessConfig {
  int patch_size = 14;
  int merge_kernel_size = 2;
  int64_t in_patch_limit = 65536;     // patches before padding
  int patch_limit_on_one_side = 512;  // patches per side
  std::array<double, 3> image_mean = {0.5, 0.5, 0.5};
  std::array<double, 3> image_std = {0.5, 0.5, 0.5};
  // Transparent background: chessboard, top-left square white.
  int chessboard_square = 8;
  uint8_t chessboard_white = 255;
  uint8_t chessboard_gray = 180;
};

// navit_resize_image: the resized size (never larger than the input) and the right/bottom padding.
struct NavitPlan {
  int new_width = 0, new_height = 0;
  int pad_width = 0, pad_height = 0;
  int64_t num_tokens = 0;  // (padded h / 28) * (padded w / 28): <|media_pad|> positions after the merge
};
Result<NavitPlan> navit_plan(uint32_t width, uint32_t height, const VisionPreprocessConfig& cfg = {});

struct PreprocessedImage {
  uint32_t width = 0, height = 0;  // native (stored) size: the one the prompt names
  NavitPlan plan;
  std::vector<uint8_t> rgb;  // new_height x new_width x 3 after resize and composite, before padding
  std::vector<float> pixel_values;  // [patches, 3, patch, patch], patches in raster order
  std::array<int64_t, 3> grid_thw = {1, 0, 0};  // t, padded h / patch, padded w / patch
  int64_t num_patches() const { return grid_thw[0] * grid_thw[1] * grid_thw[2]; }
};

Result<PreprocessedImage> preprocess_image(const DecodedImage& image, const VisionPreprocessConfig& cfg = {});

// The processor's placeholder, with one <|media_pad|> that the model expands.
std::string image_prompt(uint32_t width, uint32_t height);
// The placeholder with the pad repeated num_tokens times (the expanded form a server feeds the model).
std::string expanded_image_prompt(uint32_t width, uint32_t height, int64_t num_tokens);

}  // namespace kestrel::media
