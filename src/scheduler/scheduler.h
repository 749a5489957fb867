// The single-owner scheduler loop (docs/architecture.md §4): one thread owns the waiting queue, the
// running sequences, the cache pools and the engine. Each step: take new requests and cancels →
// admit while KDA slots are free → plan (every decode first, then whole prefill chunks while the
// token budget lasts) → give each run its MLA pages (preempting the youngest sequence by
// recompute when pages run out) → one batched forward → sample → emit → free.
// Prefill chunks have a fixed size per sequence (not cut to fit the budget), so a sequence's
// numerics do not depend on what else is running: logits are bitwise identical alone or batched.
// Thread-safety: submit/cancel/stats/ready/drain may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cache/cache_pools.h"
#include "cache/prefix_cache.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "scheduler/engine_service.h"
#include "scheduler/logits_processor.h"
#include "scheduler/metrics.h"

namespace kestrel {

struct SchedulerConfig {
  int max_waiting = 64;           // queued requests beyond this → submit() says unavailable (HTTP 429)
  int64_t max_batch_tokens = 256; // tokens per step
  int64_t prefill_chunk = 128;    // tokens per prefill chunk of one sequence (≤ max_batch_tokens)
  int max_context = 4096;         // prompt + generated tokens per sequence
  CachePoolConfig cache;          // max_slots = max running sequences
  bool prefix_cache = false;      // reuse cached prompt prefixes (MLA pages + KDA snapshots)
  PrefixCacheConfig prefix;
  // Everything besides the tokens that decides whether cached state is reusable: the server builds it from
  // the model identity, the kernels mode and the cache layout. Different fingerprint, no shared hits.
  std::string cache_fingerprint;
};

class Scheduler final : public EngineService {
 public:
  static Result<std::unique_ptr<Scheduler>> create(Engine& engine, const SchedulerConfig& cfg);
  ~Scheduler() override;

  Result<uint64_t> submit(GenerationRequest req) override;
  void cancel(uint64_t id) override;
  ServiceStats stats() const override;
  bool ready() const override { return ready_.load(); }
  // Drops every cached prefix (admin flush); runs on the scheduler thread before its next step.
  void flush_prefix_cache() override;
  int max_context() const override { return cfg_.max_context; }
  // Waits until the prefix cache's disk writer has written everything queued (tests: before a restart).
  void flush_prefix_tier();
  // Stops admitting, lets in-flight requests finish for up to `bound`, cancels the rest, stops.
  void drain(std::chrono::milliseconds bound);

 private:
  struct Seq {
    GenerationRequest req;
    SequenceState st;
    int slot = -1;
    std::vector<int32_t> blocks;
    std::vector<int32_t> tokens;  // prompt + generated: everything the cache must hold
    int64_t prompt_len = 0;
    int generated = 0;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<LogitsProcessor> proc;
    std::chrono::steady_clock::time_point arrival, last_token;
    bool first_token_sent = false;
    // Prefix cache: the chain keys of the full blocks of `tokens` (grown as tokens are fed), the boundaries
    // where the prefill is cut so a KDA snapshot can be taken there (ascending), the snapshot held for the
    // generation end and the boundary it holds.
    Digest root{};
    std::vector<BlockExtraKey> extra_keys;  // the request's image keys
    std::vector<Digest> keys;
    std::vector<int64_t> cuts;  // pairs: (boundary recorded, tokens fed when the state is taken)
    int32_t held = -1;
    int64_t held_at = 0;
    int cached = 0;  // prompt tokens reused at first admission
    int64_t prefill_len = 0;  // tokens to prefill at the last admission (prompt, or prompt + generated after preemption)
    int64_t pending() const { return static_cast<int64_t>(tokens.size()) - st.n_tokens; }
  };
  Scheduler(Engine& e, const SchedulerConfig& c) : engine_(e), cfg_(c) {}
  void loop(std::stop_token stop);
  bool take_inbox(bool block, std::stop_token& stop);
  void admit();
  Status check_media(const GenerationRequest& req) const;
  bool step();
  void finish(Seq& s, FinishReason r, const std::string& error = "");
  void preempt(Seq& s);
  void release(Seq& s, bool keep_prefix);
  void sample_and_emit(Seq& s, std::span<float> logits);
  // Prefix cache hooks (no-ops without one).
  void attach_prefix(Seq& s);
  void after_forward(Seq& s, int64_t T);
  void retire_prefix(Seq& s, bool keep);
  std::span<const Digest> keys_for(Seq& s, int64_t n_blocks);
  int64_t next_cut(const Seq& s) const;

  Engine& engine_;
  SchedulerConfig cfg_;
  std::unique_ptr<CachePools> pools_;
  std::unique_ptr<PrefixCache> prefix_;
  std::atomic<bool> flush_requested_{false};

  // Shared with other threads (under mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationRequest> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  bool draining_ = false;
  int64_t waiting_count_ = 0, running_count_ = 0;  // mirrors for stats()
  int64_t blocks_used_ = 0, slots_used_ = 0;
  Metrics metrics_;
  PrefixCacheStats prefix_stats_;
  std::atomic<bool> ready_{false};

  // Scheduler-thread only.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order (oldest first)
  std::mt19937_64 seed_rng_{0x5eed};
  std::vector<SeqRun> runs_;
  std::vector<Seq*> run_seqs_;
  std::vector<float> logits_;
  std::vector<std::pair<float, int32_t>> lp_scratch_;
  GenerationEvent token_event_;
  std::deque<GenerationRequest> taken_requests_;  // take_inbox's swap targets, empty between calls
  std::vector<uint64_t> taken_cancels_;
  std::jthread thread_;
};

}  // namespace kestrel
