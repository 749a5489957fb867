// The single-owner scheduler loop (docs/architecture.md §4): one thread owns the waiting queue, the
// running sequences, the cache pools and the engine. Each step: take new requests and cancels →
// admit while KDA slots are free → plan (every decode first, then whole prefill chunks while the
// token budget lasts) → give each run its MLA pages (preempting the youngest sequence by
// recompute when pages run out) → one batched forward → sample → emit → free.
// Prefill chunks have a fixed size per sequence (not cut to fit the budget), so a sequence's
// numerics do not depend on what else is running: logits are bitwise identical alone or batched.
// In a cell (runtime/cell.h) every forward is a cell step on rank 0 and attention is data parallel: every rank
// owns cache pools of the configured size, rank 0 keeps a ledger of each other rank's pools (cache_pools.h) and
// places each admitted request on one rank (the one with the most free pages net of what its running sequences
// still need, ties to the lowest; requests with images or a hand-off on rank 0).
// A sequence placed on another rank runs there from the plan (slot, page table); its logits come back and are
// sampled here. Freeing it (finish, cancel, preemption) frees the ledger's slot and pages and sends the rank a
// drop in the next plan. The prefix cache serves rank 0's sequences only. A failed step (a lost rank) fails every request with the
// error and stops the loop for good; failure() says why. On a normal stop the loop ends the cell's followers.
// Thread-safety: submit/cancel/stats/ready/failure/drain may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/cache_pools.h"
#include "cache/prefix_cache.h"
#include "runtime/cell.h"
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
  // `cell` (rank 0 of a cell, or null): every forward runs as a cell step; it must outlive the scheduler, and
  // only the scheduler thread talks to it.
  static Result<std::unique_ptr<Scheduler>> create(Engine& engine, const SchedulerConfig& cfg, Cell* cell = nullptr);
  // The pools' configuration for `cfg`: a cell's other ranks build theirs (Cell::hold_in) from it.
  static CachePoolConfig pool_config(const SchedulerConfig& cfg);
  ~Scheduler() override;

  Result<uint64_t> submit(GenerationRequest req) override;
  void cancel(uint64_t id) override;
  ServiceStats stats() const override;
  bool ready() const override { return ready_.load(); }
  std::string failure() const override;
  // Drops every cached prefix (admin flush); runs on the scheduler thread before its next step.
  void flush_prefix_cache() override;
  int max_context() const override { return cfg_.max_context; }
  // Waits until the prefix cache's disk writer has written everything queued (tests: before a restart).
  void flush_prefix_tier();
  // Stops admitting, lets in-flight requests finish for up to `bound`, cancels the rest, stops; returns once the
  // loop has ended.
  void drain(std::chrono::milliseconds bound);

  // Prefill/decode disaggregation (request.h Handoff; pd/). The pools' arenas and geometry are fixed for the
  // scheduler's life; their contents belong to the scheduler thread, except a parked or reserved sequence's
  // memory, which belongs to its hand-off until one of the calls below returns it. A cancel of such a request is
  // applied when its hand-off reports back. Stop the hand-offs before destroying the scheduler.
  CachePools& pools() { return *pools_; }
  // kSend: the parked request ends and its memory is freed (no transfer may read it any more): finish kLength
  // when `error` is empty (its one token was handed off), kError otherwise.
  void release_parked(uint64_t id, const std::string& error);
  // kReceive: the state landed in the reserved memory and was verified; `first` (token, logprob, top) is the
  // request's first token and the sequence joins the decode batch.
  void admit_received(uint64_t id, const GenerationEvent& first);
  // kReceive: the hand-off failed; the client gets `error` now, the reserved memory stays taken (a peer may
  // still write into it) until release_reserved.
  void fail_received(uint64_t id, const std::string& error);
  void release_reserved(uint64_t id);

 private:
  struct Seq {
    GenerationRequest req;
    SequenceState st;  // on another rank of a cell: the ledger's bookkeeping (n_tokens, no views)
    int rank = 0;      // the cell rank whose pools hold it
    bool fresh = false;  // placed on another rank and not yet sent there
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
    std::vector<int64_t> shares;  // grid boundaries a waiting request asked this prefill to store (ascending)
    int cached = 0;  // prompt tokens reused at first admission
    int64_t prefill_len = 0;  // tokens to prefill at the last admission (prompt, or prompt + generated after preemption)
    int64_t pending() const { return static_cast<int64_t>(tokens.size()) - st.n_tokens; }
    bool handoff_cancelled = false;  // parked or reserved when the cancel came
    bool final_sent = false;
  };
  enum class NoteKind { kReleaseParked, kAdmitReceived, kFailReceived, kReleaseReserved };
  struct HandoffNote {
    NoteKind kind;
    uint64_t id;
    GenerationEvent event;
    std::string error;
  };
  Scheduler(Engine& e, const SchedulerConfig& c, Cell* cell) : engine_(e), cfg_(c), cell_(cell) {}
  void loop(std::stop_token stop);
  bool take_inbox(bool block, std::stop_token& stop);
  void admit();
  // The rank a request is placed on (-1: none has a free slot it may use).
  int place(const Seq& s) const;
  CachePools& pools_of(const Seq& s) { return s.rank == 0 ? *pools_ : *ledgers_[static_cast<size_t>(s.rank)]; }
  // The forward of runs_: in one process, or as a cell step with the drops and remote runs; false if it failed.
  bool forward();
  // Under mu_: the pools' occupancy for stats().
  void publish_pools_locked();
  int64_t waiting_prompt_tokens() const;
  Status check_media(const GenerationRequest& req) const;
  bool step();
  void finish(Seq& s, FinishReason r, const std::string& error = "");
  void emit_final(Seq& s, FinishReason r, const std::string& error);
  void emit_token(Seq& s, const GenerationEvent& ev);
  void park(Seq& s);
  bool reserve(std::unique_ptr<Seq>& s);
  void note(HandoffNote n);
  void apply_note(HandoffNote& n);
  void preempt(Seq& s);
  void release(Seq& s, bool keep_prefix);
  void sample_and_emit(Seq& s, std::span<float> logits);
  // A cell step failed: every request (queued, waiting, running) ends with the error; nothing runs again.
  void fail_cell(const Status& st);
  // Prefix cache hooks (no-ops without one).
  void attach_prefix(Seq& s);
  void after_forward(Seq& s, int64_t T);
  void retire_prefix(Seq& s, bool keep);
  std::span<const Digest> keys_for(Seq& s, int64_t n_blocks);
  int64_t next_cut(const Seq& s) const;
  bool waits_for_shared_prefill(Seq& s);

  Engine& engine_;
  SchedulerConfig cfg_;
  Cell* cell_ = nullptr;
  std::unique_ptr<CachePools> pools_;
  std::vector<std::unique_ptr<CachePools>> ledgers_;  // by cell rank (none for rank 0, whose pools are pools_)
  std::vector<CellRun> cell_runs_;  // the next cell step's drops, then its remote runs
  std::unique_ptr<PrefixCache> prefix_;
  std::atomic<bool> flush_requested_{false};

  // Shared with other threads (under mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationRequest> inbox_;
  std::vector<uint64_t> cancels_;
  std::vector<HandoffNote> notes_;
  uint64_t next_id_ = 1;
  bool draining_ = false;
  std::string failure_;  // set once by fail_cell
  int64_t waiting_count_ = 0, running_count_ = 0;  // mirrors for stats()
  int64_t waiting_tokens_ = 0;                      // mirror: waiting_prompt_tokens()
  int64_t blocks_used_ = 0, slots_used_ = 0;
  std::vector<int64_t> rank_blocks_used_, rank_sequences_;  // a cell: per rank
  Metrics metrics_;
  PrefixCacheStats prefix_stats_;
  std::atomic<bool> ready_{false};

  // Scheduler-thread only.
  bool failed_ = false;
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order (oldest first)
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> parked_, reserved_;  // hand-offs in progress
  std::mt19937_64 seed_rng_{0x5eed};
  std::vector<SeqRun> runs_;
  std::vector<Seq*> run_seqs_;
  std::vector<float> logits_;
  std::vector<SeqRun> local_runs_;
  std::vector<int64_t> rows_;  // run i's logits row
  std::vector<std::pair<float, int32_t>> lp_scratch_;
  GenerationEvent token_event_;
  std::deque<GenerationRequest> taken_requests_;  // take_inbox's swap targets, empty between calls
  std::vector<uint64_t> taken_cancels_;
  std::vector<HandoffNote> taken_notes_;
  std::jthread thread_;
};

}  // namespace kestrel
