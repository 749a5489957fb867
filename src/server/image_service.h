// The images of a chat request as the server sees them (docs/vision.md §7): the server collects the `image_url`
// parts in message order and hands their URLs to an ImageService, which the app implements with the decoder, the
// reference preprocessing and the model's vision tower. The server renders the returned placeholders into the
// prompt and passes the embeddings and image hashes to the scheduler. Implementations are thread-safe (called
// from the image worker pool, server/image_queue.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel::server {

struct ImageBatch {
  std::vector<std::string> prompts;  // expanded placeholder text per image, in order
  std::shared_ptr<const std::vector<float>> embeddings;  // [tokens, hidden], image by image
  std::vector<std::array<uint8_t, 32>> hashes;           // per image: bytes + preprocessing config + grid
  int64_t tokens = 0;                                    // <|media_pad|> positions of all prompts
};

struct ImageMetrics {
  int64_t images_total = 0;        // images encoded
  int64_t image_tokens_total = 0;  // their <|media_pad|> positions
  int64_t rejected_total = 0;      // requests refused for an image (format, limits, URL); not stopped ones
  int64_t encodes_total = 0;       // tower batches run (one per request with images)
  double encode_seconds_sum = 0;   // wall time of those batches (tower + projector)
};

class ImageService {
 public:
  virtual ~ImageService() = default;
  // Decodes, preprocesses and encodes one request's images. Errors are kInvalidArgument / kUnsupported /
  // kTooLarge with a message fit for the client (no decoder text): the server answers 400. `stop`, when set, is
  // asked between the encoder's blocks: true ends the work with kUnavailable (the request was cancelled).
  virtual Result<ImageBatch> prepare(std::span<const std::string> urls, const std::function<bool()>& stop = {}) const = 0;
  virtual ImageMetrics metrics() const = 0;
};

}  // namespace kestrel::server
