#include "server/image_queue.h"

#include <algorithm>
#include <utility>

namespace kestrel::server {

ImageQueue::ImageQueue(const ImageService& service, ImageQueueOptions options) : service_(service), options_(options) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) threads_.emplace_back([this] { work(); });
  threads_.emplace_back([this] { reap(); });
}

ImageQueue::~ImageQueue() {
  std::deque<Job> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    left.swap(waiting_);
    metrics_.waiting = 0;
  }
  work_cv_.notify_all();
  reap_cv_.notify_all();
  for (Job& j : left) j.done(unavailable("the server is shutting down"));
  for (std::thread& t : threads_) t.join();
}

Status ImageQueue::submit(std::vector<std::string> urls, Clock::time_point deadline, std::function<bool()> cancelled,
                          Done done) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return unavailable("the server is shutting down");
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_queued) {
      ++metrics_.refused_total;
      return unavailable("too many requests with images are waiting (" + std::to_string(options_.max_queued) + ")");
    }
    waiting_.push_back(Job{std::move(urls), deadline, std::move(cancelled), std::move(done)});
    metrics_.waiting = static_cast<int64_t>(waiting_.size());
  }
  work_cv_.notify_one();
  reap_cv_.notify_one();
  return Status::ok();
}

ImageQueueMetrics ImageQueue::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  return metrics_;
}

void ImageQueue::drop(Job& job, bool timed_out) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++(timed_out ? metrics_.timed_out_total : metrics_.cancelled_total);
  }
  job.done(unavailable(timed_out ? "the request timed out while its images were waiting or encoding"
                                 : "the request was cancelled"));
}

void ImageQueue::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [this] { return stopping_ || !waiting_.empty(); });
      if (stopping_) return;
      job = std::move(waiting_.front());
      waiting_.pop_front();
      metrics_.waiting = static_cast<int64_t>(waiting_.size());
      ++metrics_.running;
    }
    auto gone = [&] { return job.cancelled && job.cancelled(); };
    auto late = [&] { return Clock::now() >= job.deadline; };
    if (gone() || late()) {
      const bool timed_out = !gone();
      {
        std::lock_guard<std::mutex> lk(mu_);
        --metrics_.running;
      }
      drop(job, timed_out);
      continue;
    }
    auto batch = service_.prepare(job.urls, [&] { return gone() || late(); });
    {
      std::lock_guard<std::mutex> lk(mu_);
      --metrics_.running;
    }
    // A result that arrives for a client that left, or after the deadline, is dropped.
    if (gone() || late()) {
      drop(job, !gone());
      continue;
    }
    job.done(std::move(batch));
  }
}

void ImageQueue::reap() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (stopping_) return;
    // Waiting jobs that were cancelled or expired leave the queue without running.
    std::vector<std::pair<Job, bool>> dropped;
    const auto now = Clock::now();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const bool gone = it->cancelled && it->cancelled();
      if (gone || now >= it->deadline) {
        dropped.emplace_back(std::move(*it), !gone);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    metrics_.waiting = static_cast<int64_t>(waiting_.size());
    if (!dropped.empty()) {
      lk.unlock();
      for (auto& [job, timed_out] : dropped) drop(job, timed_out);
      lk.lock();
      continue;
    }
    // Cancellation is a predicate, not an event: look again every 50 ms while anything waits.
    if (waiting_.empty()) {
      reap_cv_.wait(lk);
    } else {
      Clock::time_point next = now + std::chrono::milliseconds(50);
      for (const Job& j : waiting_) next = std::min(next, j.deadline);
      reap_cv_.wait_until(lk, next);
    }
  }
}

}  // namespace kestrel::server
