// The server's ImageService over the loaded engine (docs/vision.md §7): data: URLs parsed under the byte limit (or,
// with a fetcher, any other URL fetched under the same limit and the URL policy, docs/vision.md §3.3), decoded and preprocessed under the request limits (runtime/image_input), then one vision-tower batch per request.
// Called from the server's image worker pool (server/image_queue.h); tower batches run one at a time (a mutex),
// beside the scheduler's forward; the weights are read-only.
#pragma once

#include <mutex>

#include "runtime/engine.h"
#include "media/url_fetch.h"
#include "runtime/image_input.h"
#include "server/image_service.h"

namespace kestrel::app {

class EngineImageService final : public server::ImageService {
 public:
  // `fetcher` (may be null: remote URLs refused) must outlive the service.
  EngineImageService(const Engine& engine, ImageRequestLimits limits, const media::UrlFetcher* fetcher = nullptr)
      : engine_(engine), limits_(limits), fetcher_(fetcher) {}
  Result<server::ImageBatch> prepare(std::span<const std::string> urls,
                                     const std::function<bool()>& stop = {}) const override;
  server::ImageMetrics metrics() const override;

 private:
  Result<server::ImageBatch> prepare_unlocked(std::span<const std::string> urls,
                                              const std::function<bool()>& stop) const;
  const Engine& engine_;
  const ImageRequestLimits limits_;
  const media::UrlFetcher* const fetcher_;
  mutable std::mutex encode_mu_;   // one tower batch at a time
  mutable std::mutex metrics_mu_;  // guards metrics_
  mutable server::ImageMetrics metrics_;
};

}  // namespace kestrel::app
