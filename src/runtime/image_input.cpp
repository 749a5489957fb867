#include "runtime/image_input.h"

#include "base/check.h"

namespace kestrel {

Result<PreparedImages> prepare_images(std::span<const std::vector<uint8_t>> files, const ImageRequestLimits& limits) {
  if (files.size() > limits.max_images)
    return invalid_argument(std::to_string(files.size()) + " images in one request; the limit is " +
                            std::to_string(limits.max_images));
  PreparedImages out;
  media::DecodeBudget budget{limits.max_decoded_bytes};
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string what = "image " + std::to_string(i + 1);
    auto decoded = media::decode_image(files[i], limits.per_image, &budget);
    if (!decoded) return Status(decoded.error().code(), what + ": " + decoded.error().message());
    auto pre = media::preprocess_image(*decoded);
    if (!pre) return Status(pre.error().code(), what + ": " + pre.error().message());
    out.tokens += pre->plan.num_tokens;
    if (out.tokens > limits.max_tokens)
      return invalid_argument(what + ": the request's images need " + std::to_string(out.tokens) +
                              " image tokens so far; the limit is " + std::to_string(limits.max_tokens));
    out.prompts.push_back(media::expanded_image_prompt(pre->width, pre->height, pre->plan.num_tokens));
    out.images.push_back(std::move(*pre));
  }
  return out;
}

Result<std::vector<float>> embed_images(const Engine& engine, const PreparedImages& images) {
  std::vector<VisionImage> batch;
  for (const media::PreprocessedImage& im : images.images) batch.push_back({im.pixel_values.data(), im.grid_thw});
  auto rows = engine.encode_images(batch);
  if (!rows) return rows.error();
  const int64_t D = engine.config().text.hidden_size;
  KCHECK(static_cast<int64_t>(rows->size()) == images.tokens * D, "vision tower rows != the images' token count");
  return rows;
}

}  // namespace kestrel
