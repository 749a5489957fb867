// Requests with images through the scheduler (GenerationRequest::media / image_keys) on the generated k3-tiny
// checkpoint and the committed fixtures: prefill chunks that split the image's <|media_pad|> run take the right rows
// (the greedy tokens and logprobs equal Engine::prefill_media + decode run directly), batching with a text-only
// request changes no bit, a prefix-cache hit for the same image skips its cached rows, and submit refuses a request
// whose rows or keys do not match its pads.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "common/test_util.h"
#include "runtime/image_input.h"
#include "runtime/sampler.h"
#include "scheduler/scheduler.h"

namespace kestrel {
namespace {

using namespace std::chrono_literals;

struct Result1 {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int cached = 0;
};

class Waiter {
 public:
  void attach(GenerationRequest& r) {
    r.on_event = [this](const GenerationEvent& e) {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.finish == FinishReason::kNone) {
        out_.tokens.push_back(e.token);
        out_.logprobs.push_back(e.logprob);
      } else {
        out_.cached = e.cached_tokens;
        error_ = e.error;
        done_ = true;
        cv_.notify_all();
      }
    };
  }
  Result1 wait() {
    std::unique_lock<std::mutex> lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, 120s, [&] { return done_; }));
    EXPECT_EQ(error_, "");
    return out_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Result1 out_;
  std::string error_;
  bool done_ = false;
};

class ImageSchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::make_checkpoint("k3-tiny", dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    auto e = Engine::load(dir_->path());
    ASSERT_TRUE(e) << e.error().message();
    engine_ = std::move(*e);
  }

  // A prompt of 20 text ids, the image's pads, 5 more ids; its rows and key (at the first pad).
  GenerationRequest image_request(const std::string& file, int max_new = 4) {
    const std::vector<std::vector<uint8_t>> files = {testing::read_bytes(std::string(KESTREL_TEST_DATA) + "/vision/" + file)};
    auto p = prepare_images(files, ImageRequestLimits{});
    EXPECT_TRUE(p) << p.error().message();
    auto rows = embed_images(*engine_, *p);
    EXPECT_TRUE(rows) << rows.error().message();
    GenerationRequest r;
    for (int i = 0; i < 20; ++i) r.prompt.push_back(30 + i);
    r.image_keys.push_back({static_cast<int64_t>(r.prompt.size()), p->hashes[0]});
    r.prompt.insert(r.prompt.end(), static_cast<size_t>(p->tokens), engine_->config().media_pad_id);
    for (int i = 0; i < 5; ++i) r.prompt.push_back(60 + i);
    r.media = std::make_shared<const std::vector<float>>(std::move(*rows));
    r.params.temperature = 0;
    r.params.max_new_tokens = max_new;
    r.params.top_logprobs = 0;
    return r;
  }

  static testing::TempDir* dir_;
  std::unique_ptr<Engine> engine_;
};
testing::TempDir* ImageSchedulerTest::dir_ = nullptr;

TEST_F(ImageSchedulerTest, ChunkedAndBatchedImagePrefillEqualsTheEngineDirectly) {
  GenerationRequest req = image_request("rgb.png");
  // Directly: one prefill with the rows, then greedy decode.
  SequenceState seq = engine_->new_sequence();
  auto logits = engine_->prefill_media(seq, req.prompt, *req.media);
  ASSERT_TRUE(logits) << logits.error().message();
  std::vector<int32_t> direct;
  std::vector<float> cur = *logits;
  for (int i = 0; i < 4; ++i) {
    direct.push_back(static_cast<int32_t>(std::max_element(cur.begin(), cur.end()) - cur.begin()));
    if (i < 3) cur = *engine_->decode(seq, direct.back());
  }
  SchedulerConfig c;
  c.cache.budget_bytes = 256ll << 20;
  c.prefill_chunk = 8;  // 20 text ids, then 6 pads: chunk edges at 8, 16, 24 cut the pad run
  c.max_batch_tokens = 16;
  c.prefix_cache = false;
  auto s = Scheduler::create(*engine_, c);
  ASSERT_TRUE(s) << s.error().message();
  Waiter alone;
  alone.attach(req);
  ASSERT_TRUE((*s)->submit(req));
  const Result1 a = alone.wait();
  EXPECT_EQ(a.tokens, direct);
  // Beside a text-only request: the same bits.
  GenerationRequest again = image_request("rgb.png"), text;
  text.prompt = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  text.params.temperature = 0;
  text.params.max_new_tokens = 6;
  Waiter w1, w2;
  w1.attach(again);
  w2.attach(text);
  ASSERT_TRUE((*s)->submit(text));
  ASSERT_TRUE((*s)->submit(again));
  const Result1 b = w1.wait();
  w2.wait();
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.logprobs, a.logprobs);
}

TEST_F(ImageSchedulerTest, PrefixHitOnTheSameImageSkipsItsCachedRows) {
  SchedulerConfig c;
  c.cache.budget_bytes = 256ll << 20;
  c.cache.page_tokens = 8;
  c.prefill_chunk = 8;
  c.max_batch_tokens = 16;
  c.prefix_cache = true;
  c.prefix.snapshot_budget_bytes = 16ll << 20;  // KDA state snapshots at chunk ends (hybrid model)
  c.cache_fingerprint = "test-model";
  auto s = Scheduler::create(*engine_, c);
  ASSERT_TRUE(s) << s.error().message();
  // rgb.png: pads at 20..25, the hit ends at 24 (the chunk grid): the second run takes rows 4 and 5 only.
  std::vector<Result1> same;
  for (int i = 0; i < 2; ++i) {
    GenerationRequest r = image_request("rgb.png");
    Waiter w;
    w.attach(r);
    ASSERT_TRUE((*s)->submit(r));
    same.push_back(w.wait());
  }
  EXPECT_EQ(same[1].cached, 24);  // past the first pad: cached image blocks reused
  EXPECT_EQ(same[1].tokens, same[0].tokens);
  EXPECT_EQ(same[1].logprobs, same[0].logprobs);
  // palette.png then palette_trns.png: identical prompts (both 40x33), other pixels.
  GenerationRequest opaque = image_request("palette.png"), other = image_request("palette_trns.png");
  ASSERT_EQ(other.prompt, opaque.prompt);
  Waiter w2, w3;
  w2.attach(opaque);
  ASSERT_TRUE((*s)->submit(opaque));
  w2.wait();
  w3.attach(other);
  ASSERT_TRUE((*s)->submit(other));
  const Result1 o = w3.wait();
  EXPECT_LE(o.cached, 20);  // the same token ids, another image: no block at or after its first pad (24 without
                            // the image key)
}

TEST_F(ImageSchedulerTest, SubmitRefusesRowsOrKeysThatDoNotMatchThePads) {
  SchedulerConfig c;
  c.cache.budget_bytes = 256ll << 20;
  auto s = Scheduler::create(*engine_, c);
  ASSERT_TRUE(s) << s.error().message();
  GenerationRequest r = image_request("rgb.png");
  r.prompt.pop_back();
  r.prompt.erase(r.prompt.begin() + 21);  // one pad fewer than rows
  auto id = (*s)->submit(r);
  ASSERT_FALSE(id);
  EXPECT_EQ(id.error().message(), "the prompt has 5 image positions but 6 image embedding rows");
  GenerationRequest k = image_request("rgb.png");
  k.image_keys[0].position = 3;  // not a pad
  id = (*s)->submit(k);
  ASSERT_FALSE(id);
  EXPECT_EQ(id.error().message(), "image key at position 3 is not an image position");
}

}  // namespace
}  // namespace kestrel
