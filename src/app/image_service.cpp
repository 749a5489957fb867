#include "app/image_service.h"

#include <chrono>
#include <utility>

#include "media/data_url.h"

namespace kestrel::app {

Result<server::ImageBatch> EngineImageService::prepare(std::span<const std::string> urls,
                                                       const std::function<bool()>& stop) const {
  auto batch = prepare_unlocked(urls, stop);
  if (!batch && batch.error().code() != StatusCode::kUnavailable) {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    ++metrics_.rejected_total;
  }
  return batch;
}

Result<server::ImageBatch> EngineImageService::prepare_unlocked(std::span<const std::string> urls,
                                                                const std::function<bool()>& stop) const {
  if (urls.size() > limits_.max_images)
    return invalid_argument(std::to_string(urls.size()) + " images in one request; the limit is " +
                            std::to_string(limits_.max_images));
  std::vector<std::vector<uint8_t>> files;
  for (size_t i = 0; i < urls.size(); ++i) {
    Result<std::vector<uint8_t>> bytes = [&]() -> Result<std::vector<uint8_t>> {
      if (fetcher_ != nullptr && media::is_remote_image_url(urls[i])) return fetcher_->fetch(urls[i], stop);
      auto url = media::parse_image_url(urls[i], media::DataUrlLimits{limits_.per_image.max_file_bytes});
      if (!url) return url.error();
      return std::move(url->bytes);
    }();
    if (!bytes) return Status(bytes.error().code(), "image " + std::to_string(i + 1) + ": " + bytes.error().message());
    files.push_back(std::move(*bytes));
  }
  auto prepared = prepare_images(files, limits_);
  if (!prepared) return prepared.error();
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<float>> rows = [&] {
    std::lock_guard<std::mutex> lk(encode_mu_);
    if (stop && stop()) return Result<std::vector<float>>(unavailable("image encoding stopped"));
    return embed_images(engine_, *prepared, stop);
  }();
  if (!rows) return rows.error();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    metrics_.images_total += static_cast<int64_t>(prepared->images.size());
    metrics_.image_tokens_total += prepared->tokens;
    ++metrics_.encodes_total;
    metrics_.encode_seconds_sum += seconds;
  }
  server::ImageBatch out;
  out.prompts = std::move(prepared->prompts);
  out.hashes = std::move(prepared->hashes);
  out.tokens = prepared->tokens;
  out.embeddings = std::make_shared<const std::vector<float>>(std::move(*rows));
  return out;
}

server::ImageMetrics EngineImageService::metrics() const {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  return metrics_;
}

}  // namespace kestrel::app
