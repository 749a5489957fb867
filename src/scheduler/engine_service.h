// The scheduler as seen by the server: submit / cancel / stats. Thread-safe: HTTP threads call it;
// one scheduler thread owns requests, caches and the runner (docs/architecture.md §4).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "cache/prefix_cache.h"
#include "scheduler/request.h"

namespace kestrel {

struct ServiceStats {
  int64_t waiting = 0;        // queued, not yet admitted
  int64_t waiting_prompt_tokens = 0;  // the tokens they must feed (prompts; a preempted one's generated tokens too)
  int64_t running = 0;        // admitted sequences
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t page_tokens = 0;  // tokens per KV block
  int64_t state_slots_used = 0, state_slots_total = 0;  // in a cell: over all its ranks
  // A cell (data-parallel attention): per rank, the sequences it holds and its pages in use; each rank's cache
  // pools hold rank_cache_bytes. Empty / 0 in one process.
  std::vector<int64_t> rank_sequences, rank_kv_blocks_used;
  int64_t rank_cache_bytes = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int64_t preemptions_total = 0, cancelled_total = 0, requests_finished_total = 0;
  bool prefix_cache = false;
  PrefixCacheStats prefix;
  // Latency histograms (seconds): bucket upper bounds and cumulative counts, Prometheus style.
  std::vector<double> buckets;
  std::vector<int64_t> ttft_counts, tpot_counts;
  double ttft_sum = 0, tpot_sum = 0;
  int64_t ttft_n = 0, tpot_n = 0;
  // Sequences per batched forward: bucket upper bounds, cumulative counts, sum, forwards run, and the
  // largest batch so far.
  std::vector<double> step_sequences_buckets;
  std::vector<int64_t> step_sequences_counts;
  double step_sequences_sum = 0;
  int64_t steps_total = 0, step_sequences_max = 0;
};

class EngineService {
 public:
  virtual ~EngineService() = default;
  // Queues a request. Errors: queue full (kUnavailable-style → HTTP 429), prompt too long, bad params.
  virtual Result<uint64_t> submit(GenerationRequest req) = 0;
  // Cancels a queued or running request; its pages and slot are freed within one step. Idempotent.
  virtual void cancel(uint64_t id) = 0;
  virtual ServiceStats stats() const = 0;
  virtual bool ready() const = 0;         // model loaded and loop running
  // Why the service can no longer serve at all (a cell that lost a rank); empty while it can.
  virtual std::string failure() const { return {}; }
  virtual int max_context() const = 0;    // prompt + generation limit in tokens
  // Drops every cached prefix (no-op without a prefix cache).
  virtual void flush_prefix_cache() {}
  // Prometheus text appended to /metrics after the scheduler's (a disaggregated role's hand-off metrics).
  virtual std::string extra_metrics() const { return {}; }
};

}  // namespace kestrel
