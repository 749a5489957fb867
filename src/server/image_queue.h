// The bounded worker pool chat requests' images are encoded on (docs/vision.md §7), so that no HTTP I/O thread
// ever waits for the decoder or the vision tower. An I/O thread submits a request's image URLs and returns; one
// of `workers` threads runs ImageService::prepare for it; at most `max_queued` requests wait behind the running
// ones and more are refused at once (kUnavailable: the server answers 429).
//
// Every accepted request gets exactly one `done` call, on a pool thread: the batch, or an error from the service,
// or kUnavailable when it was cancelled (its `cancelled` predicate turned true: the client went away) or its
// deadline passed. A waiting request that is cancelled or expires leaves the queue without running (a reaper
// thread watches the deadlines); a running one is stopped between the tower's blocks and its result dropped.
// Thread-safe. The destructor ends waiting requests with kUnavailable and joins the threads after the running
// ones finish; the service must outlive the queue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "server/image_service.h"

namespace kestrel::server {

struct ImageQueueOptions {
  int workers = 1;     // requests encoded at once
  int max_queued = 4;  // requests waiting behind them; more → kUnavailable
};

struct ImageQueueMetrics {
  int64_t waiting = 0;            // requests in the queue now
  int64_t running = 0;            // requests being decoded / encoded now
  int64_t refused_total = 0;      // requests refused because the queue was full
  int64_t cancelled_total = 0;    // requests whose client went away before their images were ready
  int64_t timed_out_total = 0;    // requests whose deadline passed before their images were ready
};

class ImageQueue {
 public:
  using Clock = std::chrono::steady_clock;
  using Done = std::function<void(Result<ImageBatch>)>;

  ImageQueue(const ImageService& service, ImageQueueOptions options);
  ~ImageQueue();
  ImageQueue(const ImageQueue&) = delete;
  ImageQueue& operator=(const ImageQueue&) = delete;

  // Queues one request's images. kUnavailable (and no `done` call) when max_queued requests already wait.
  Status submit(std::vector<std::string> urls, Clock::time_point deadline, std::function<bool()> cancelled, Done done);
  ImageQueueMetrics metrics() const;
  const ImageService& service() const { return service_; }

 private:
  struct Job {
    std::vector<std::string> urls;
    Clock::time_point deadline;
    std::function<bool()> cancelled;
    Done done;
  };
  void work();
  void reap();
  // Ends a job that will not run: counts it and calls done (outside the lock).
  void drop(Job& job, bool timed_out);

  const ImageService& service_;
  const ImageQueueOptions options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, reap_cv_;
  std::deque<Job> waiting_;
  bool stopping_ = false;
  ImageQueueMetrics metrics_;
  std::vector<std::thread> threads_;
};

}  // namespace kestrel::server
