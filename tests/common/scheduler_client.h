// Test client of the scheduler: submits a request and collects its events; wait() blocks until the final
// event. Shared by the scheduler and prefix-cache tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/request.h"

namespace kestrel::testing {

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> tops;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int cached_tokens = 0, prompt_tokens = 0;
};

class Client {
 public:
  GenerationRequest make(std::vector<int32_t> prompt, int max_new, float temperature = 0.0f, int top_lp = 5) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.params.temperature = temperature;
    r.params.max_new_tokens = max_new;
    r.params.top_logprobs = top_lp;
    r.params.seed = 3, r.params.has_seed = true;
    r.on_event = [this](const GenerationEvent& e) {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.finish == FinishReason::kNone) {
        out_.tokens.push_back(e.token);
        out_.logprobs.push_back(e.logprob);
        out_.tops.push_back(e.top);
      } else {
        out_.finish = e.finish;
        out_.error = e.error;
        out_.cached_tokens = e.cached_tokens;
        out_.prompt_tokens = e.prompt_tokens;
        done_ = true;
        cv_.notify_all();
      }
    };
    return r;
  }
  Collected wait(std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, limit, [&] { return done_; })) << "request did not finish";
    return out_;
  }
  size_t tokens_so_far() {
    std::lock_guard<std::mutex> lk(mu_);
    return out_.tokens.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Collected out_;
  bool done_ = false;
};

}  // namespace kestrel::testing
