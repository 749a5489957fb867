// What the server hands the scheduler, and what comes back. Plain data; no engine types.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kestrel {

struct GenerationParams {
  float temperature = 1.0f;  // 0 → greedy
  int top_k = 0;             // 0 → off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool has_seed = false;     // false → the scheduler draws one
  float presence_penalty = 0.0f;    // OpenAI semantics, on generated tokens
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // HF/vLLM semantics, on prompt + generated tokens
  int max_new_tokens = 256;
  std::vector<int32_t> stop_token_ids;  // e.g. <|end_of_msg|>; empty with ignore_eos
  int top_logprobs = -1;                // -1 → no logprobs; 0..20 → logprob of the chosen token + top n
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kTimeout, kError };

// Prefill/decode disaggregation (pd/): how a request's cache changes hands.
//   kSend    (prefill side): after its first token the sequence is parked: its KDA slot and pages are kept and
//            never written, the request's cache location is reported, and it ends when the hand-off releases it.
//   kReceive (decode side): admission reserves a KDA slot and the pages of the prompt without computing anything,
//            reports their location, and the sequence joins the decode batch when the hand-off delivers the
//            first token (the state having landed in the reserved memory).
enum class Handoff { kNone, kSend, kReceive };

// Where a parked or reserved sequence's state lies in the scheduler's cache pools (cache/cache_pools.h).
struct CacheLocation {
  uint64_t request = 0;
  int slot = -1;
  std::vector<int32_t> blocks;  // page table: blocks_for(n_tokens) blocks
  int64_t n_tokens = 0;         // prompt tokens whose state the cache holds
};
const char* finish_reason_name(FinishReason r);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// One event per generated token, then exactly one final event (finish != kNone).
struct GenerationEvent {
  int32_t token = -1;  // -1 on the final event
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // filled when top_logprobs >= 0
  FinishReason finish = FinishReason::kNone;
  std::string error;      // finish == kError
  int prompt_tokens = 0;  // on the final event
  int cached_tokens = 0;  // prompt tokens served from the prefix cache
  int completion_tokens = 0;
  int step_sequences = 0;  // token events: sequences in the forward that produced this token (1 = ran alone)
};

// An image of the prompt for the prefix cache: a 256-bit hash of its content (bytes, preprocessing config, grid)
// bound into the block key at `position`, its first <|media_pad|>.
struct ImageKey {
  int64_t position = 0;
  std::array<uint8_t, 32> hash{};
};

struct GenerationRequest {
  uint64_t id = 0;  // assigned by the scheduler on submit
  std::vector<int32_t> prompt;
  GenerationParams params;
  // Prefix-cache namespace of the request (OpenAI-style `cache_salt`): requests share cached prefixes only
  // with requests of the same salt.
  std::string cache_salt;
  // Images: their embeddings [pads in prompt, hidden], row k taken at the prompt's k-th <|media_pad|>, and one key
  // per image, by position. Null / empty for text-only requests.
  std::shared_ptr<const std::vector<float>> media;
  std::vector<ImageKey> image_keys;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Called on the scheduler thread for every event; must not block (post to your own executor).
  std::function<void(const GenerationEvent&)> on_event;
  Handoff handoff = Handoff::kNone;
  // The pairing fields a PD router (sglang-router) puts into the request body: the prefill instance's bootstrap
  // address and a random room shared by the request's prefill and decode halves (docs/disaggregation.md §4).
  struct Bootstrap {
    bool present = false;
    std::string host;
    int port = 0;
    uint64_t room = 0;
  } bootstrap;
  // kSend / kReceive: called on the scheduler thread once the cache location is fixed; must not block.
  std::function<void(const CacheLocation&)> on_cache_location;
};

}  // namespace kestrel
