#include "runtime/image_input.h"

#include <openssl/evp.h>

#include <string_view>

#include "base/check.h"

namespace kestrel {

namespace {

// SHA-256 of length-prefixed fields: u64 little-endian length, then the bytes.
class FieldHash {
 public:
  FieldHash() : ctx_(EVP_MD_CTX_new()) { KCHECK(ctx_ && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1, "sha256 init"); }
  ~FieldHash() { EVP_MD_CTX_free(ctx_); }
  FieldHash(const FieldHash&) = delete;
  FieldHash& operator=(const FieldHash&) = delete;
  void field(const void* data, size_t n) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * i));
    KCHECK(EVP_DigestUpdate(ctx_, len, 8) == 1 && EVP_DigestUpdate(ctx_, data, n) == 1, "sha256 update");
  }
  void number(double v) { field(&v, sizeof v); }  // IEEE-754 bytes (little-endian hosts only: x86-64, arm64)
  std::array<uint8_t, 32> finish() {
    std::array<uint8_t, 32> out{};
    unsigned n = 0;
    KCHECK(EVP_DigestFinal_ex(ctx_, out.data(), &n) == 1 && n == 32, "sha256 final");
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::array<uint8_t, 32> image_hash(std::span<const uint8_t> bytes, const media::VisionPreprocessConfig& c,
                                   const std::array<int64_t, 3>& grid) {
  FieldHash h;
  const std::string_view tag = "kestrel-image-v1";
  h.field(tag.data(), tag.size());
  h.field(bytes.data(), bytes.size());
  for (double v : {double(c.patch_size), double(c.merge_kernel_size), double(c.in_patch_limit),
                   double(c.patch_limit_on_one_side), c.image_mean[0], c.image_mean[1], c.image_mean[2], c.image_std[0],
                   c.image_std[1], c.image_std[2], double(c.chessboard_square), double(c.chessboard_white),
                   double(c.chessboard_gray), double(grid[0]), double(grid[1]), double(grid[2])})
    h.number(v);
  return h.finish();
}

}  // namespace

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
    out.hashes.push_back(image_hash(files[i], media::VisionPreprocessConfig{}, pre->grid_thw));
    out.images.push_back(std::move(*pre));
  }
  return out;
}

Result<std::vector<float>> embed_images(const Engine& engine, const PreparedImages& images, const StopFn& stop) {
  std::vector<VisionImage> batch;
  for (const media::PreprocessedImage& im : images.images) batch.push_back({im.pixel_values.data(), im.grid_thw});
  auto rows = engine.encode_images(batch, stop);
  if (!rows) return rows.error();
  const int64_t D = engine.config().text.hidden_size;
  KCHECK(static_cast<int64_t>(rows->size()) == images.tokens * D, "vision tower rows != the images' token count");
  return rows;
}

}  // namespace kestrel
