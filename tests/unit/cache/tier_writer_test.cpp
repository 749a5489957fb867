// TierWriter: asynchronous, never-blocking puts into a lower tier (cache/tier_writer.h).
#include "cache/tier_writer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "cache/disk_store.h"
#include "tier_test_util.h"

namespace kestrel {
namespace {

using tiertest::bytes_of;
using tiertest::key_of;

// A store whose puts wait until the test opens the gate, so the queue can be filled deterministically.
class GatedStore final : public TierStore {
 public:
  Status put(const Digest& key, std::span<const uint8_t> bytes) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
    if (fail_) return io_error("gated store: failing");
    objects_.emplace(key, std::vector<uint8_t>(bytes.begin(), bytes.end()));
    return Status::ok();
  }
  Result<std::optional<std::vector<uint8_t>>> get(const Digest& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return std::optional<std::vector<uint8_t>>();
    return std::optional<std::vector<uint8_t>>(it->second);
  }
  Result<bool> contains(const Digest& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return objects_.count(key) != 0;
  }
  Status erase(const Digest&) override { return Status::ok(); }
  TierStoreStats stats() const override { return {}; }

  void open(bool fail = false) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    fail_ = fail;
    cv_.notify_all();
  }
  void wait_entered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return objects_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false, fail_ = false;
  int entered_ = 0;
  std::map<Digest, std::vector<uint8_t>> objects_;
};

TEST(TierWriter, WritesInTheBackground) {
  tiertest::ScratchDir d;
  DiskStoreOptions o;
  o.dir = d.path();
  auto store = DiskStore::open(o);
  ASSERT_TRUE(store);
  TierWriter w(**store, {});
  for (uint32_t i = 0; i < 20; ++i) EXPECT_TRUE(w.submit(key_of(i), bytes_of(i, 256)));
  w.flush();
  for (uint32_t i = 0; i < 20; ++i) {
    auto g = (*store)->get(key_of(i));
    ASSERT_TRUE(g && g->has_value()) << i;
    EXPECT_EQ(**g, bytes_of(i, 256));
  }
  const TierWriterStats st = w.stats();
  EXPECT_EQ(st.submitted, 20);
  EXPECT_EQ(st.written, 20);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.queued_bytes, 0);
}

TEST(TierWriter, FullQueueDropsInsteadOfBlocking) {
  GatedStore store;
  TierWriter w(store, TierWriterOptions{/*max_queued_objects=*/3, /*max_queued_bytes=*/1 << 20});
  ASSERT_TRUE(w.submit(key_of(0), bytes_of(0, 10)));
  store.wait_entered(1);  // the thread holds object 0 inside put(); it still counts as queued
  EXPECT_TRUE(w.submit(key_of(1), bytes_of(1, 10)));
  EXPECT_TRUE(w.submit(key_of(2), bytes_of(2, 10)));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(w.submit(key_of(3), bytes_of(3, 10)));  // full: returns at once
  EXPECT_TRUE(w.submit(key_of(1), bytes_of(1, 10)));  // already queued: on its way, not queued twice
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  TierWriterStats st = w.stats();
  EXPECT_EQ(st.dropped_full, 1);
  EXPECT_EQ(st.already_queued, 1);
  EXPECT_EQ(st.queued, 3);
  store.open();
  w.flush();
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(w.stats().written, 3);
}

TEST(TierWriter, ByteBoundDropsLargeObjects) {
  GatedStore store;
  TierWriter w(store, TierWriterOptions{/*max_queued_objects=*/100, /*max_queued_bytes=*/1000});
  EXPECT_TRUE(w.submit(key_of(0), bytes_of(0, 600)));
  EXPECT_FALSE(w.submit(key_of(1), bytes_of(1, 600)));
  EXPECT_TRUE(w.submit(key_of(2), bytes_of(2, 400)));
  EXPECT_EQ(w.stats().dropped_full, 1);
  EXPECT_EQ(w.stats().queued_bytes, 1000);
  store.open();
}

TEST(TierWriter, FailedPutsAreCounted) {
  GatedStore store;
  store.open(/*fail=*/true);
  TierWriter w(store, {});
  for (uint32_t i = 0; i < 5; ++i) EXPECT_TRUE(w.submit(key_of(i), bytes_of(i, 10)));
  w.flush();
  EXPECT_EQ(w.stats().failed, 5);
  EXPECT_EQ(w.stats().written, 0);
}

TEST(TierWriter, DrainingShutdownWritesEverything) {
  GatedStore store;
  TierWriter w(store, {});
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE(w.submit(key_of(i), bytes_of(i, 10)));
  store.wait_entered(1);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    store.open();
  });
  w.shutdown(TierWriter::Shutdown::kDrain);
  opener.join();
  EXPECT_EQ(store.size(), 10u);
  EXPECT_EQ(w.stats().written, 10);
  EXPECT_EQ(w.stats().dropped_shutdown, 0);
  EXPECT_FALSE(w.submit(key_of(99), bytes_of(99, 10)));  // stopped
  EXPECT_EQ(w.stats().dropped_shutdown, 1);
  w.shutdown(TierWriter::Shutdown::kDrain);  // idempotent
}

TEST(TierWriter, DroppingShutdownCountsWhatWasLeft) {
  GatedStore store;
  auto w = std::make_unique<TierWriter>(store, TierWriterOptions{});
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE(w->submit(key_of(i), bytes_of(i, 10)));
  store.wait_entered(1);  // object 0 is in flight; 1..9 wait
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    store.open();
  });
  w->shutdown(TierWriter::Shutdown::kDrop);
  opener.join();
  const TierWriterStats st = w->stats();
  EXPECT_EQ(st.written, 1);  // the put in flight completes
  EXPECT_EQ(st.dropped_shutdown, 9);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.queued_bytes, 0);
  EXPECT_EQ(store.size(), 1u);
  w.reset();  // destructor after shutdown: nothing left to do
}

TEST(TierWriter, DestructorStopsAnIdleWriter) {
  GatedStore store;
  store.open();
  { TierWriter w(store, {}); }
  TierWriter w(store, {});
  ASSERT_TRUE(w.submit(key_of(1), bytes_of(1, 10)));
  w.flush();
  EXPECT_EQ(store.size(), 1u);
}

}  // namespace
}  // namespace kestrel
