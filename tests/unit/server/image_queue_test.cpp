// ImageQueue (server/image_queue.h): submit never waits for the encoder, a full queue refuses at once, waiting
// requests that are cancelled or expire leave without running, a running one is stopped through the service's
// stop predicate, and every accepted request gets exactly one `done`.
#include "server/image_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

namespace kestrel::server {
namespace {

// An ImageService that holds every call until released (or until asked to stop), and records the calls.
class GatedService final : public ImageService {
 public:
  Result<ImageBatch> prepare(std::span<const std::string> urls, const std::function<bool()>& stop) const override {
    std::unique_lock<std::mutex> lk(mu_);
    ++calls_;
    started_.notify_all();
    while (!open_) {
      if (stop && stop()) return unavailable("stopped");
      gate_.wait_for(lk, std::chrono::milliseconds(5));
    }
    ImageBatch b;
    b.prompts.assign(urls.begin(), urls.end());
    b.tokens = static_cast<int64_t>(urls.size());
    return b;
  }
  ImageMetrics metrics() const override { return {}; }
  void open() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    gate_.notify_all();
  }
  void wait_calls(int n) const {
    std::unique_lock<std::mutex> lk(mu_);
    started_.wait(lk, [&] { return calls_ >= n; });
  }
  int calls() const {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable gate_, started_;
  mutable int calls_ = 0;
  bool open_ = false;
};

using Clock = ImageQueue::Clock;
const auto kFar = Clock::now() + std::chrono::hours(1);

struct Outcome {
  std::promise<Result<ImageBatch>> p;
  std::future<Result<ImageBatch>> f = p.get_future();
  ImageQueue::Done done() {
    return [this](Result<ImageBatch> r) { p.set_value(std::move(r)); };
  }
};

TEST(ImageQueueTest, SubmitReturnsWhileTheEncoderRunsAndDoneCarriesTheBatch) {
  GatedService svc;
  ImageQueue q(svc, {1, 4});
  Outcome a;
  ASSERT_TRUE(q.submit({"u1", "u2"}, kFar, {}, a.done()).is_ok());
  svc.wait_calls(1);  // the worker is inside prepare; submit has long returned
  EXPECT_EQ(q.metrics().running, 1);
  EXPECT_EQ(a.f.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  svc.open();
  auto r = a.f.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->tokens, 2);
  EXPECT_EQ(r->prompts, (std::vector<std::string>{"u1", "u2"}));
}

TEST(ImageQueueTest, FullQueueRefusesAtOnce) {
  GatedService svc;
  ImageQueue q(svc, {1, 1});
  Outcome running, waiting;
  ASSERT_TRUE(q.submit({"a"}, kFar, {}, running.done()).is_ok());
  svc.wait_calls(1);
  ASSERT_TRUE(q.submit({"b"}, kFar, {}, waiting.done()).is_ok());
  Status refused = q.submit({"c"}, kFar, {}, [](Result<ImageBatch>) { ADD_FAILURE() << "done after a refusal"; });
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  auto m = q.metrics();
  EXPECT_EQ(m.refused_total, 1);
  EXPECT_EQ(m.waiting, 1);
  svc.open();
  EXPECT_TRUE(running.f.get());
  EXPECT_TRUE(waiting.f.get());
  EXPECT_EQ(svc.calls(), 2);
}

TEST(ImageQueueTest, CancelledWaitingRequestLeavesWithoutRunning) {
  GatedService svc;
  ImageQueue q(svc, {1, 4});
  Outcome running, waiting;
  std::atomic<bool> gone{false};
  ASSERT_TRUE(q.submit({"a"}, kFar, {}, running.done()).is_ok());
  svc.wait_calls(1);
  ASSERT_TRUE(q.submit({"b"}, kFar, [&] { return gone.load(); }, waiting.done()).is_ok());
  gone = true;
  auto r = waiting.f.get();  // answered while the worker is still held by the first request
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
  auto m = q.metrics();
  EXPECT_EQ(m.cancelled_total, 1);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.running, 1);
  svc.open();
  EXPECT_TRUE(running.f.get());
  EXPECT_EQ(svc.calls(), 1);
}

TEST(ImageQueueTest, ExpiredWaitingRequestTimesOutWithoutRunning) {
  GatedService svc;
  ImageQueue q(svc, {1, 4});
  Outcome running, waiting;
  ASSERT_TRUE(q.submit({"a"}, kFar, {}, running.done()).is_ok());
  svc.wait_calls(1);
  ASSERT_TRUE(q.submit({"b"}, Clock::now() + std::chrono::milliseconds(20), {}, waiting.done()).is_ok());
  auto r = waiting.f.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(q.metrics().timed_out_total, 1);
  svc.open();
  EXPECT_TRUE(running.f.get());
  EXPECT_EQ(svc.calls(), 1);
}

TEST(ImageQueueTest, CancelledRunningRequestIsStoppedAndFreesTheWorker) {
  GatedService svc;  // never opened: only the stop predicate ends a call
  ImageQueue q(svc, {1, 4});
  Outcome a;
  std::atomic<bool> gone{false};
  ASSERT_TRUE(q.submit({"a"}, kFar, [&] { return gone.load(); }, a.done()).is_ok());
  svc.wait_calls(1);
  gone = true;
  auto r = a.f.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
  auto m = q.metrics();
  EXPECT_EQ(m.cancelled_total, 1);
  EXPECT_EQ(m.running, 0);
  // The worker is free again: a running request past its deadline is stopped the same way.
  Outcome b;
  ASSERT_TRUE(q.submit({"b"}, Clock::now() + std::chrono::milliseconds(50), {}, b.done()).is_ok());
  EXPECT_FALSE(b.f.get());
  EXPECT_EQ(q.metrics().timed_out_total, 1);
}

TEST(ImageQueueTest, DestructorEndsWaitingRequestsAndLetsTheRunningOneFinish) {
  GatedService svc;
  Outcome running, waiting;
  std::thread opener([&] {
    waiting.f.wait();  // ended by the destructor, which then waits for the running request
    svc.open();
  });
  {
    ImageQueue q(svc, {1, 4});
    ASSERT_TRUE(q.submit({"a"}, kFar, {}, running.done()).is_ok());
    svc.wait_calls(1);
    ASSERT_TRUE(q.submit({"b"}, kFar, {}, waiting.done()).is_ok());
  }
  opener.join();
  EXPECT_FALSE(waiting.f.get());
  EXPECT_TRUE(running.f.get());
  EXPECT_EQ(svc.calls(), 1);
}

}  // namespace
}  // namespace kestrel::server
