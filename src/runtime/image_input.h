// One request's images on their way into the model (docs/vision.md §6): each encoded file decoded under the
// limits (and one decode budget across the request), preprocessed as the reference does, its expanded
// placeholder (`<|media_begin|>image WxH<|media_content|>` + N × `<|media_pad|>` + `<|media_end|>`) for the prompt,
// and all of them run through the model's vision tower + projector as one batch.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "media/image_decode.h"
#include "media/preprocess.h"
#include "runtime/engine.h"

namespace kestrel {

struct ImageRequestLimits {
  media::ImageLimits per_image;
  size_t max_images = 8;                     // images per request
  uint64_t max_decoded_bytes = uint64_t{512} << 20;  // decoded pixels across the request's images
  int64_t max_tokens = 16384;                // image tokens (<|media_pad|> positions) across the request
};

struct PreparedImages {
  std::vector<media::PreprocessedImage> images;
  // Per image: SHA-256 of "kestrel-image-v1", the encoded bytes, the preprocessing config and the patch grid, each
  // length-prefixed (docs/vision.md §8): the image's identity in the prefix cache.
  std::vector<std::array<uint8_t, 32>> hashes;
  std::vector<std::string> prompts;  // expanded placeholder text per image, in order
  int64_t tokens = 0;                // <|media_pad|> positions in all prompts
};

// Decodes and preprocesses `files` (encoded bytes) in order; errors name the image ("image 2: ...") and carry
// no decoder text (media::decode_image).
Result<PreparedImages> prepare_images(std::span<const std::vector<uint8_t>> files, const ImageRequestLimits& limits);

// The projected embeddings of every prepared image, in order: [images.tokens, hidden] (one tower batch).
// `stop` is asked between the tower's blocks (a cancelled request): true ends it with kUnavailable.
Result<std::vector<float>> embed_images(const Engine& engine, const PreparedImages& images, const StopFn& stop = {});

}  // namespace kestrel
