#include "scheduler/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace kestrel {

using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<Scheduler>> Scheduler::create(Engine& engine, const SchedulerConfig& cfg, Cell* cell) {
  if (cfg.prefill_chunk < 1 || cfg.prefill_chunk > cfg.max_batch_tokens)
    return invalid_argument("scheduler: prefill chunk must be in 1..max batch tokens");
  if (cfg.max_context < 2 || cfg.max_waiting < 0) return invalid_argument("scheduler: bad limits");
  if (cell != nullptr && cell->rank() != 0) return invalid_argument("scheduler: only rank 0 of a cell schedules");
  auto s = std::unique_ptr<Scheduler>(new Scheduler(engine, cfg, cell));
  const CachePoolConfig pc = pool_config(cfg);
  auto pools = CachePools::create(engine.model().cache_geometry(), pc);
  if (!pools) return pools.error();
  s->pools_ = std::move(*pools);
  const int ranks = cell != nullptr ? cell->size() : 1;
  s->ledgers_.resize(static_cast<size_t>(ranks));
  for (int r = 1; r < ranks; ++r) {
    auto ledger = CachePools::create_ledger(engine.model().cache_geometry(), pc);
    if (!ledger) return ledger.error();
    s->ledgers_[static_cast<size_t>(r)] = std::move(*ledger);
  }
  s->rank_blocks_used_.assign(static_cast<size_t>(ranks), 0);
  s->rank_sequences_.assign(static_cast<size_t>(ranks), 0);
  if (cfg.prefix_cache) {
    if (cfg.prefill_chunk % s->pools_->page_tokens() != 0)
      return invalid_argument("prefix cache: the prefill chunk (" + std::to_string(cfg.prefill_chunk) +
                              ") must be a multiple of the page size (" + std::to_string(s->pools_->page_tokens()) + ")");
    // The cache layout is part of the identity: another page size or cache dtype never shares a hit. The
    // fingerprint seeds every key chain and is the disk objects' model digest.
    s->cfg_.cache_fingerprint += "|page=" + std::to_string(s->pools_->page_tokens()) + "|kv=" +
                                std::string(kv_cache_dtype_name(s->pools_->kv_dtype()));
    auto pc = PrefixCache::create(*s->pools_, cfg.prefix, s->cfg_.cache_fingerprint,
                                  cfg.prefill_chunk / s->pools_->page_tokens());
    if (!pc) return pc.error();
    s->prefix_ = std::move(*pc);
    s->prefix_stats_ = s->prefix_->stats();  // capacity on /metrics from the start, not after the first step
  }
  if (s->pools_->num_blocks() * s->pools_->page_tokens() < cfg.max_context)
    return invalid_argument("cache: " + std::to_string(s->pools_->num_blocks() * s->pools_->page_tokens()) +
                            " tokens of MLA pages cannot hold one max-context sequence (" +
                            std::to_string(cfg.max_context) + "); raise --cache-mib or lower --max-context");
  s->running_.reserve(static_cast<size_t>(pc.max_slots * ranks));
  s->thread_ = std::jthread([p = s.get()](std::stop_token st) { p->loop(st); });
  s->ready_ = true;
  return s;
}

CachePoolConfig Scheduler::pool_config(const SchedulerConfig& cfg) {
  CachePoolConfig pc = cfg.cache;
  pc.max_seq_tokens = cfg.max_context;
  return pc;
}

Scheduler::~Scheduler() {
  {
    // Under the lock: the scheduler thread checks stop_requested() under it before it waits, so the request
    // cannot fall between its check and its wait (a lost wake-up would leave join() waiting forever).
    std::lock_guard<std::mutex> lk(mu_);
    thread_.request_stop();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<uint64_t> Scheduler::submit(GenerationRequest req) {
  const int vocab = engine_.config().text.vocab_size;
  if (req.prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t t : req.prompt)
    if (t < 0 || t >= vocab) return invalid_argument("prompt token id " + std::to_string(t) + " is outside the vocabulary");
  if (static_cast<int64_t>(req.prompt.size()) >= cfg_.max_context)
    return too_large("the prompt has " + std::to_string(req.prompt.size()) + " tokens; the context limit is " +
                     std::to_string(cfg_.max_context));
  if (req.params.max_new_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  if (req.handoff != Handoff::kNone && !req.on_cache_location)
    return invalid_argument("a hand-off request needs a cache location callback");
  KESTREL_RETURN_IF_ERROR(check_media(req));
  std::lock_guard<std::mutex> lk(mu_);
  if (!failure_.empty()) return unavailable(failure_);
  if (draining_) return unavailable("the server is shutting down");
  if (static_cast<int64_t>(inbox_.size()) + waiting_count_ >= cfg_.max_waiting)
    return unavailable("the waiting queue is full (" + std::to_string(cfg_.max_waiting) + " requests)");
  req.id = next_id_++;
  const uint64_t id = req.id;
  inbox_.push_back(std::move(req));
  cv_.notify_all();
  return id;
}

// Images: one embedding row per <|media_pad|> of the prompt, and image keys at pad positions in order (they enter
// the prefix-cache key chain, so a hit implies the same images).
Status Scheduler::check_media(const GenerationRequest& req) const {
  if (!req.media && req.image_keys.empty()) return Status::ok();
  const int32_t pad = engine_.config().media_pad_id;
  const int64_t D = engine_.config().text.hidden_size;
  const int64_t pads = std::count(req.prompt.begin(), req.prompt.end(), pad);
  if (!req.media || !engine_.has_vision() || static_cast<int64_t>(req.media->size()) != pads * D)
    return invalid_argument("the prompt has " + std::to_string(pads) + " image positions but " +
                            std::to_string(req.media ? req.media->size() / static_cast<size_t>(D) : 0) +
                            " image embedding rows");
  int64_t last = -1;
  for (const ImageKey& k : req.image_keys) {
    if (k.position <= last || k.position >= static_cast<int64_t>(req.prompt.size()) ||
        req.prompt[static_cast<size_t>(k.position)] != pad)
      return invalid_argument("image key at position " + std::to_string(k.position) + " is not an image position");
    last = k.position;
  }
  return Status::ok();
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

// Scheduler thread: the tokens the waiting sequences must feed (a preempted one's generated tokens too), for
// stats()' mirror.
int64_t Scheduler::waiting_prompt_tokens() const {
  int64_t n = 0;
  for (const auto& p : waiting_) n += static_cast<int64_t>(p->tokens.size());
  return n;
}

ServiceStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  ServiceStats s;
  s.waiting = waiting_count_ + static_cast<int64_t>(inbox_.size());
  s.waiting_prompt_tokens = waiting_tokens_;
  for (const GenerationRequest& r : inbox_) s.waiting_prompt_tokens += static_cast<int64_t>(r.prompt.size());
  s.page_tokens = pools_->page_tokens();
  s.running = running_count_;
  s.kv_blocks_used = blocks_used_;
  s.kv_blocks_total = pools_->num_blocks() * static_cast<int64_t>(ledgers_.size());
  s.state_slots_used = slots_used_;
  s.state_slots_total = pools_->num_slots() * static_cast<int>(ledgers_.size());
  if (ledgers_.size() > 1) {
    s.rank_sequences = rank_sequences_;
    s.rank_kv_blocks_used = rank_blocks_used_;
    s.rank_cache_bytes = pools_->arena_bytes();
  }
  s.prompt_tokens_total = metrics_.prompt_tokens;
  s.generation_tokens_total = metrics_.generation_tokens;
  s.preemptions_total = metrics_.preemptions;
  s.cancelled_total = metrics_.cancelled;
  s.requests_finished_total = metrics_.finished;
  s.buckets = metrics_.ttft.bounds();
  s.ttft_counts = metrics_.ttft.counts();
  s.tpot_counts = metrics_.tpot.counts();
  s.ttft_sum = metrics_.ttft.sum(), s.ttft_n = metrics_.ttft.n();
  s.tpot_sum = metrics_.tpot.sum(), s.tpot_n = metrics_.tpot.n();
  s.prefix_cache = cfg_.prefix_cache;
  s.prefix = prefix_stats_;
  if (prefix_) prefix_->tier_stats(s.prefix);  // the writer's and the store's counters, current
  s.step_sequences_buckets = metrics_.step_sequences.bounds();
  s.step_sequences_counts = metrics_.step_sequences.counts();
  s.step_sequences_sum = metrics_.step_sequences.sum();
  s.steps_total = metrics_.step_sequences.n();
  s.step_sequences_max = metrics_.step_sequences_max;
  return s;
}

std::string Scheduler::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void Scheduler::release_parked(uint64_t id, const std::string& error) { note({NoteKind::kReleaseParked, id, {}, error}); }
void Scheduler::admit_received(uint64_t id, const GenerationEvent& first) {
  note({NoteKind::kAdmitReceived, id, first, ""});
}
void Scheduler::fail_received(uint64_t id, const std::string& error) { note({NoteKind::kFailReceived, id, {}, error}); }
void Scheduler::release_reserved(uint64_t id) { note({NoteKind::kReleaseReserved, id, {}, ""}); }

void Scheduler::note(HandoffNote n) {
  std::lock_guard<std::mutex> lk(mu_);
  notes_.push_back(std::move(n));
  cv_.notify_all();
}

// A hand-off reported back (scheduler thread).
void Scheduler::apply_note(HandoffNote& n) {
  auto& map = n.kind == NoteKind::kReleaseParked ? parked_ : reserved_;
  auto it = map.find(n.id);
  if (it == map.end()) return;
  Seq& s = *it->second;
  switch (n.kind) {
    case NoteKind::kReleaseParked:
      finish(s, s.handoff_cancelled ? FinishReason::kCancelled : !n.error.empty() ? FinishReason::kError : FinishReason::kLength,
             n.error);
      map.erase(it);
      return;
    case NoteKind::kAdmitReceived: {
      if (s.final_sent) return;  // failed earlier; only release_reserved frees it
      std::unique_ptr<Seq> p = std::move(it->second);
      map.erase(it);
      running_.push_back(std::move(p));
      if (s.handoff_cancelled) return finish(s, FinishReason::kCancelled);
      pools_->mark_filled(s.st, s.blocks, s.prompt_len);
      s.sampler->skip_draw();
      n.event.step_sequences = 0;
      return emit_token(s, n.event);
    }
    case NoteKind::kFailReceived:
      emit_final(s, s.handoff_cancelled ? FinishReason::kCancelled : FinishReason::kError, n.error);
      return;
    case NoteKind::kReleaseReserved:
      if (!s.final_sent) emit_final(s, FinishReason::kError, "the hand-off was abandoned");
      release(s, false);
      map.erase(it);
      return;
  }
}

void Scheduler::flush_prefix_tier() {
  if (prefix_) prefix_->flush_tier();
}

void Scheduler::flush_prefix_cache() {
  flush_requested_ = true;
  std::lock_guard<std::mutex> lk(mu_);
  cv_.notify_all();
}

void Scheduler::drain(std::chrono::milliseconds bound) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    draining_ = true;
  }
  const auto until = Clock::now() + bound;
  while (Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (inbox_.empty() && waiting_count_ == 0 && running_count_ == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& r : inbox_) cancels_.push_back(r.id);
    cancels_.push_back(0);  // 0: cancel everything left
    cv_.notify_all();
  }
  // Wait for the loop to flush the cancellations, then stop it.
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (inbox_.empty() && waiting_count_ == 0 && running_count_ == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ready_ = false;
  {
    std::lock_guard<std::mutex> lk(mu_);  // as in the destructor: no lost wake-up
    thread_.request_stop();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // the loop has ended (and a cell's followers with it)
}

// Moves new requests into waiting_ and applies cancels. Blocks (when asked) until there is work.
// The taken requests and cancels are swapped into members (emptied again below), not into locals: a
// default-constructed std::deque allocates, and this runs once per step.
bool Scheduler::take_inbox(bool block, std::stop_token& stop) {
  std::deque<GenerationRequest>& in = taken_requests_;
  std::vector<uint64_t>& cancels = taken_cancels_;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (block)
      cv_.wait(lk, [&] {
        return stop.stop_requested() || !inbox_.empty() || !cancels_.empty() || !notes_.empty() || flush_requested_;
      });
    in.swap(inbox_);
    cancels.swap(cancels_);
    taken_notes_.swap(notes_);
  }
  const auto now = Clock::now();
  for (auto& r : in) {
    auto s = std::make_unique<Seq>();
    s->arrival = now;
    s->tokens.reserve(static_cast<size_t>(std::min<int64_t>(
        cfg_.max_context, static_cast<int64_t>(r.prompt.size()) + std::max(0, r.params.max_new_tokens) + 1)));
    s->tokens = r.prompt;
    s->prompt_len = static_cast<int64_t>(r.prompt.size());
    if (prefix_) s->root = chain_root(cfg_.cache_fingerprint, r.cache_salt);
    for (const ImageKey& k : r.image_keys) s->extra_keys.push_back({k.position, k.hash});
    if (!r.params.has_seed) r.params.seed = seed_rng_();
    SamplingParams sp{r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p, r.params.seed};
    s->sampler = std::make_unique<Sampler>(sp);
    s->proc = std::make_unique<LogitsProcessor>(r.params, engine_.config().text.vocab_size, r.prompt);
    s->req = std::move(r);
    waiting_.push_back(std::move(s));
  }
  for (uint64_t id : cancels) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (id == 0 || (*it)->req.id == id) {
        finish(**it, FinishReason::kCancelled);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : running_)
      if (s && (id == 0 || s->req.id == id)) finish(*s, FinishReason::kCancelled);
    for (auto* m : {&parked_, &reserved_})
      for (auto& [rid, s] : *m)
        if (id == 0 || rid == id) s->handoff_cancelled = true;
  }
  for (HandoffNote& n : taken_notes_) apply_note(n);
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  const bool any = !in.empty() || !cancels.empty() || !taken_notes_.empty();
  in.clear();
  cancels.clear();
  taken_notes_.clear();
  return any;
}

void Scheduler::admit() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (waits_for_shared_prefill(**it)) {
      ++it;
      continue;
    }
    const int rank = place(**it);
    if (rank < 0) break;
    std::unique_ptr<Seq> s = std::move(*it);
    it = waiting_.erase(it);
    s->rank = rank;
    s->fresh = rank != 0;
    s->slot = *pools_of(*s).acquire_slot(s->st);
    // The block list never reallocates while decoding (the pools reserve the page tables likewise).
    s->blocks.reserve(static_cast<size_t>(pools_->blocks_for(cfg_.max_context)));
    if (s->req.handoff == Handoff::kReceive) {
      if (!reserve(s)) break;
      continue;
    }
    attach_prefix(*s);
    running_.push_back(std::move(s));
  }
}

// Data-parallel placement: among the ranks with a free slot, the one with the most free pages net of what the
// sequences running there still need for their tokens (so that requests admitted together spread), ties to the
// lowest rank. Images and hand-offs stay on rank 0: the plan carries neither embeddings nor transfers.
int Scheduler::place(const Seq& s) const {
  const bool rank0_only = s.req.media != nullptr || s.req.handoff != Handoff::kNone;
  std::vector<int64_t> room(ledgers_.size(), 0);
  for (size_t r = 0; r < ledgers_.size(); ++r) room[r] = (r == 0 ? *pools_ : *ledgers_[r]).free_blocks();
  for (const auto& p : running_)
    if (p) {
      const CachePools& pools = p->rank == 0 ? *pools_ : *ledgers_[static_cast<size_t>(p->rank)];
      room[static_cast<size_t>(p->rank)] -=
          std::max<int64_t>(0, pools.blocks_for(static_cast<int64_t>(p->tokens.size())) - static_cast<int64_t>(p->blocks.size()));
    }
  int best = -1;
  for (size_t r = 0; r < (rank0_only ? 1 : ledgers_.size()); ++r) {
    const CachePools& pools = r == 0 ? *pools_ : *ledgers_[r];
    if (pools.free_slots() > 0 && (best < 0 || room[r] > room[static_cast<size_t>(best)])) best = static_cast<int>(r);
  }
  return best;
}

// Sharing a prefill still running: a fresh request whose prompt has more than one grid chunk in common (same
// chain keys: same salt, tokens and images) with a prompt still being prefilled, beyond where that prefill
// stands, waits; the running prefill stores its pages (and KDA snapshot) when it reaches the last common grid
// boundary, and the request then attaches them like any cached prefix. Both would otherwise compute the same
// tokens side by side. A request never waits for one that has left `running_` (finished, cancelled, preempted).
bool Scheduler::waits_for_shared_prefill(Seq& s) {
  if (!prefix_ || s.generated > 0 || s.req.handoff == Handoff::kReceive) return false;
  const int64_t B = prefix_->block_tokens(), G = cfg_.prefill_chunk, L = static_cast<int64_t>(s.tokens.size());
  const int64_t max_blocks = (L - 1) / G * G / B;
  if (max_blocks == 0) return false;
  const auto keys = keys_for(s, max_blocks);
  for (auto& r : running_) {
    if (!r || r->generated > 0 || r->st.n_tokens >= r->prefill_len) continue;  // not prefilling
    const int64_t rb = std::min(r->prefill_len / B, max_blocks);
    const auto rk = keys_for(*r, rb);
    int64_t common = 0;
    while (common < rb && rk[static_cast<size_t>(common)] == keys[static_cast<size_t>(common)]) ++common;
    const int64_t at = common * B / G * G;
    if (at < G || at <= r->st.n_tokens) continue;
    if (std::find(r->shares.begin(), r->shares.end(), at) == r->shares.end()) {
      r->shares.insert(std::upper_bound(r->shares.begin(), r->shares.end(), at), at);
    }
    return true;
  }
  return false;
}

// kReceive admission: the pages of the prompt next to the slot, nothing computed; the sequence waits in reserved_
// for its state. False (the sequence back at the queue's front) when the pages are short.
bool Scheduler::reserve(std::unique_ptr<Seq>& s) {
  while (!pools_->grow(s->st, s->blocks, s->prompt_len)) {
    if (prefix_ && prefix_->make_room(pools_->blocks_for(s->prompt_len) - static_cast<int64_t>(s->blocks.size())))
      continue;
    pools_->release(s->st, s->slot, s->blocks);
    s->slot = -1;
    waiting_.push_front(std::move(s));
    return false;
  }
  CacheLocation loc{s->req.id, s->slot, s->blocks, s->prompt_len};
  auto on_location = s->req.on_cache_location;
  reserved_.emplace(s->req.id, std::move(s));
  on_location(loc);
  return true;
}

// kSend: after the first token the sequence leaves the batch with its memory and waits in parked_.
void Scheduler::park(Seq& s) {
  for (auto& p : running_)
    if (p.get() == &s) {
      parked_.emplace(s.req.id, std::move(p));
      break;
    }
  s.req.on_cache_location(CacheLocation{s.req.id, s.slot, s.blocks, s.st.n_tokens});
}

// The chain keys of the first n_blocks full blocks of s.tokens (computed once, extended as needed).
std::span<const Digest> Scheduler::keys_for(Seq& s, int64_t n_blocks) {
  const int64_t B = prefix_->block_tokens();
  if (static_cast<int64_t>(s.keys.size()) < n_blocks)
    extend_block_keys(s.root, std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(n_blocks * B)), B, s.keys,
                      s.extra_keys);
  return std::span<const Digest>(s.keys.data(), static_cast<size_t>(n_blocks));
}

// Admission: reuse the longest usable cached prefix on the chunk grid (always leaving at least one token to
// compute, whose logits start the generation) and plan the boundaries where this prefill leaves snapshots:
// its prompt end and a branch point (where the cached pages go deeper than the usable hit), both floored to
// the grid, so they are ends of chunks the prefill runs anyway.
void Scheduler::attach_prefix(Seq& s) {
  if (!prefix_ || s.rank != 0) return;
  const int64_t B = prefix_->block_tokens(), G = cfg_.prefill_chunk, L = static_cast<int64_t>(s.tokens.size());
  const auto keys = keys_for(s, L / B);
  const PrefixCache::Lookup lk = prefix_->attach(keys, (L - 1) / G * G / B, G / B, s.st, s.blocks, s.slot);
  if (s.generated == 0) s.cached = static_cast<int>(lk.tokens);
  s.prefill_len = L;
  s.cuts.clear();
  if (!prefix_->needs_snapshot()) return;
  // A snapshot is recorded for the boundary `at` (a block multiple) from the state after `take` tokens;
  // they differ only under an injected test fault.
  auto add = [&](int64_t at) {
    int64_t take = at;
    if (prefix_->fault() == SnapshotFault::kStale) take = at - B;
    if (prefix_->fault() == SnapshotFault::kOneTokenLate) take = at + 1;
    if (at > s.st.n_tokens && take > s.st.n_tokens && take <= L) s.cuts.push_back(at), s.cuts.push_back(take);
  };
  if (lk.page_tokens / G * G > lk.tokens) add(lk.page_tokens / G * G);
  add(L / G * G);
}

// After a forward: store the snapshot of a cut this sequence just reached; in decode, copy the state at
// each block boundary into the snapshot it holds for its generation end.
void Scheduler::after_forward(Seq& s, int64_t T) {
  if (!prefix_ || s.rank != 0) return;
  const int64_t n = s.st.n_tokens, B = prefix_->block_tokens();
  while (!s.shares.empty() && s.shares.front() <= n) {  // a boundary a waiting request shares
    const int64_t at = s.shares.front();
    s.shares.erase(s.shares.begin());
    if (at != n) continue;
    if (prefix_->needs_snapshot()) prefix_->store_snapshot(keys_for(s, at / B), s.blocks, pools_->slot_data(s.slot));
    else prefix_->store_pages(keys_for(s, at / B), s.blocks);
  }
  if (!prefix_->needs_snapshot()) return;
  while (s.cuts.size() >= 2 && s.cuts[1] <= n) {
    const int64_t at = s.cuts[0], take = s.cuts[1];
    s.cuts.erase(s.cuts.begin(), s.cuts.begin() + 2);
    if (take != n) continue;
    if (take >= at) {
      prefix_->store_snapshot(keys_for(s, at / B), s.blocks, pools_->slot_data(s.slot));
    } else if (s.held >= 0 || (s.held = prefix_->hold().value_or(-1)) >= 0) {
      // Stale-snapshot fault: the pages of `at` do not exist yet; recorded when the sequence retires.
      std::copy_n(pools_->slot_data(s.slot), pools_->slot_floats(), prefix_->held_data(s.held));
      s.held_at = at;
    }
  }
  if (prefix_->generation_snapshots() && T == 1 && s.generated > 0 && n % B == 0 && n > s.prompt_len) {
    if (s.held < 0) {
      if (auto h = prefix_->hold()) s.held = *h;
    }
    if (s.held >= 0) {
      std::copy_n(pools_->slot_data(s.slot), pools_->slot_floats(), prefix_->held_data(s.held));
      s.held_at = n;
    }
  }
}

// A sequence leaves (finished, cancelled, preempted): its full blocks stay cached, and the state it held
// for its generation end becomes that boundary's snapshot. Nothing is kept from a failed sequence.
void Scheduler::retire_prefix(Seq& s, bool keep) {
  if (!prefix_ || s.rank != 0) return;
  const int64_t B = prefix_->block_tokens();
  if (s.held >= 0) {
    if (keep && s.held_at > 0) prefix_->commit(keys_for(s, s.held_at / B), s.blocks, s.held);
    else prefix_->release_held(s.held);
    s.held = -1, s.held_at = 0;
  }
  if (!keep) return;
  // Only blocks computed in whole grid chunks (or attached from the cache) are stored: a prompt's short last
  // chunk and decode round differently from the whole chunk a longer cold prompt runs there, so a hit reaching
  // such a block would not reproduce the cold run. Opting into generation snapshots (deeper hits, documented as
  // not bit-equal) keeps every full block.
  const int64_t G = cfg_.prefill_chunk, exact = std::min(s.st.n_tokens, s.prefill_len) / G * G;
  const int64_t stored = prefix_->generation_snapshots() ? s.st.n_tokens / B : exact / B;
  if (stored > 0) prefix_->store_pages(keys_for(s, stored), s.blocks);
  // Disk tier, pure-MLA model: the deepest grid boundary computed in whole grid chunks.
  if (exact > 0) prefix_->write_down_pages(keys_for(s, exact / B), s.blocks);
}

void Scheduler::release(Seq& s, bool keep_prefix) {
  if (s.slot >= 0) retire_prefix(s, keep_prefix);
  if (s.slot >= 0) {
    pools_of(s).release(s.st, s.slot, s.blocks);
    // The rank frees its copy in the next step, before any run of that step can take the slot or pages again.
    if (s.rank != 0 && !s.fresh) cell_runs_.push_back(CellRun{s.slot, s.rank, false, false, {}, false, true});
  }
  s.slot = -1;
  s.fresh = false;
  // Publish immediately so stats are current by the time the client sees the final event.
  // The prefix cache's counts go with the pool's: one scrape must never see pages it holds counted as in use
  // by nobody.
  std::lock_guard<std::mutex> lk(mu_);
  if (prefix_) prefix_stats_ = prefix_->stats();
  publish_pools_locked();
}

void Scheduler::publish_pools_locked() {
  blocks_used_ = slots_used_ = 0;
  for (size_t r = 0; r < ledgers_.size(); ++r) {
    const CachePools& p = r == 0 ? *pools_ : *ledgers_[r];
    rank_blocks_used_[r] = p.num_blocks() - p.free_blocks();
    rank_sequences_[r] = p.num_slots() - p.free_slots();
    blocks_used_ += rank_blocks_used_[r];
    slots_used_ += rank_sequences_[r];
  }
}

// Emits the final event and frees the sequence's cache. The caller drops it from its list.
void Scheduler::finish(Seq& s, FinishReason r, const std::string& error) {
  release(s, r != FinishReason::kError);
  emit_final(s, r, error);
  // Mark for removal from running_ (pointer compare in callers).
  for (auto& p : running_)
    if (p.get() == &s) p.reset();
}

void Scheduler::emit_final(Seq& s, FinishReason r, const std::string& error) {
  if (s.final_sent) return;
  s.final_sent = true;
  GenerationEvent ev;
  ev.finish = r;
  ev.error = error;
  ev.prompt_tokens = static_cast<int>(s.prompt_len);
  ev.completion_tokens = s.generated;
  ev.cached_tokens = s.cached;
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.finished++;
    if (r == FinishReason::kCancelled) metrics_.cancelled++;
  }
  if (s.req.on_event) s.req.on_event(ev);
  s.req.on_event = nullptr;
}

// Recompute-style preemption: drop the cache, keep the tokens (prompt + generated so far); the
// sequence goes back to the front of the queue and re-prefills when a slot frees up.
void Scheduler::preempt(Seq& s) {
  s.shares.clear();  // requests waiting on this prefill stop waiting once it leaves running_
  release(s, true);
  for (auto& p : running_)
    if (p.get() == &s) {
      waiting_.push_front(std::move(p));
      break;
    }
  std::lock_guard<std::mutex> lk(mu_);
  metrics_.preemptions++;
}

void Scheduler::sample_and_emit(Seq& s, std::span<float> logits) {
  s.proc->apply(logits);
  const int32_t tok = s.sampler->sample(logits);
  GenerationEvent& ev = token_event_;  // reused: `top` keeps its capacity, so no allocation per token
  ev.token = tok;
  ev.logprob = 0.0f;
  ev.top.clear();
  ev.step_sequences = static_cast<int>(runs_.size());
  if (s.req.params.top_logprobs >= 0)
    ev.logprob = LogitsProcessor::logprob_of(logits, tok, s.req.params.top_logprobs, ev.top, lp_scratch_);
  emit_token(s, ev);
}

// A token joins the sequence (sampled here, or the first one handed over) and goes to the client.
void Scheduler::emit_token(Seq& s, const GenerationEvent& ev) {
  const int32_t tok = ev.token;
  s.proc->observe_generated(tok);
  s.tokens.push_back(tok);
  s.generated++;
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.generation_tokens++;
    if (!s.first_token_sent) metrics_.ttft.observe(std::chrono::duration<double>(now - s.arrival).count());
    else metrics_.tpot.observe(std::chrono::duration<double>(now - s.last_token).count());
  }
  s.first_token_sent = true;
  s.last_token = now;
  if (s.req.on_event) s.req.on_event(ev);
  if (s.req.handoff == Handoff::kSend && s.generated == 1) return park(s);
  const auto& stops = s.req.params.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) return finish(s, FinishReason::kStop);
  if (s.generated >= s.req.params.max_new_tokens || static_cast<int64_t>(s.tokens.size()) >= cfg_.max_context)
    return finish(s, FinishReason::kLength);
}

// One scheduling step; returns false when there was nothing to run.
bool Scheduler::step() {
  if (flush_requested_.exchange(false) && prefix_) prefix_->clear();
  const auto now = Clock::now();
  for (auto& s : running_)
    if (s && now > s->req.deadline) finish(*s, FinishReason::kTimeout);
  for (auto it = waiting_.begin(); it != waiting_.end();)
    if (now > (*it)->req.deadline) finish(**it, FinishReason::kTimeout), it = waiting_.erase(it);
    else ++it;
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  admit();

  // Plan: decodes first (oldest first), then whole prefill chunks while the budget lasts.
  runs_.clear();
  run_seqs_.clear();
  int64_t budget = cfg_.max_batch_tokens;
  auto plan = [&](Seq& s, int64_t T) -> bool {
    // Pages for the new tokens; preempt the youngest other running sequence if short.
    CachePools& pools = pools_of(s);
    while (!pools.grow(s.st, s.blocks, s.st.n_tokens + T)) {
      // Cached blocks no running sequence uses go first, then the youngest other sequence on the same rank.
      if (prefix_ && s.rank == 0 &&
          prefix_->make_room(pools.blocks_for(s.st.n_tokens + T) - static_cast<int64_t>(s.blocks.size())))
        continue;
      Seq* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it)
        if (*it && it->get() != &s && (*it)->rank == s.rank &&
            std::find(run_seqs_.begin(), run_seqs_.end(), it->get()) == run_seqs_.end()) {
          victim = it->get();
          break;
        }
      if (victim == nullptr) return false;
      preempt(*victim);
    }
    runs_.push_back(SeqRun{s.tokens.data() + s.st.n_tokens, T, &s.st, false});
    if (s.req.media) {  // image rows from the first <|media_pad|> not yet in the cache
      const int32_t pad = engine_.config().media_pad_id;
      const auto prompt_end = s.tokens.begin() + s.prompt_len, at = s.tokens.begin() + std::min(s.st.n_tokens, s.prompt_len);
      runs_.back().media = s.req.media->data() + std::count(s.tokens.begin(), at, pad) * engine_.config().text.hidden_size;
      runs_.back().media_rows = std::count(at, prompt_end, pad);
    }
    run_seqs_.push_back(&s);
    budget -= T;
    return true;
  };
  for (auto& p : running_)
    if (p && p->pending() == 1 && budget >= 1) plan(*p, 1);
  for (auto& p : running_) {
    if (!p || p->pending() <= 1) continue;
    int64_t T = std::min(cfg_.prefill_chunk, p->pending());
    if (const int64_t cut = next_cut(*p); cut > p->st.n_tokens) T = std::min(T, cut - p->st.n_tokens);
    if (T > budget) continue;
    if (!plan(*p, T) && runs_.empty()) {
      // Alone it still does not fit: this request can never run.
      finish(*p, FinishReason::kError, "the request needs more cache than the server has");
    }
  }
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  {
    std::lock_guard<std::mutex> lk(mu_);
    waiting_count_ = static_cast<int64_t>(waiting_.size());
    waiting_tokens_ = waiting_prompt_tokens();
    running_count_ = static_cast<int64_t>(running_.size());
    publish_pools_locked();
  }
  // Nothing to run, but freed sequences of other ranks to drop: a step of drops only (the ranks free their memory now).
  if (runs_.empty() && cell_runs_.empty()) return false;
  if (!forward()) return false;
  if (runs_.empty()) return true;
  const int64_t V = engine_.config().text.vocab_size;
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < run_seqs_.size(); ++i) {
    Seq& s = *run_seqs_[i];
    if (s.generated == 0) prompt_tokens += runs_[i].T;
    after_forward(s, runs_[i].T);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.prompt_tokens += prompt_tokens;
    const auto n = static_cast<int64_t>(runs_.size());
    metrics_.step_sequences.observe(static_cast<double>(n));
    metrics_.step_sequences_max = std::max(metrics_.step_sequences_max, n);
    if (prefix_) prefix_stats_ = prefix_->stats();
  }
  for (size_t i = 0; i < run_seqs_.size(); ++i) {
    Seq& s = *run_seqs_[i];
    if (s.pending() == 0) sample_and_emit(s, std::span<float>(logits_.data() + rows_[i] * V, static_cast<size_t>(V)));
  }
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  return true;
}

bool Scheduler::forward() {
  rows_.resize(runs_.size());
  if (cell_ == nullptr) {
    engine_.model().forward_batch(runs_, logits_);
    for (size_t i = 0; i < runs_.size(); ++i) rows_[i] = static_cast<int64_t>(i);
    return true;
  }
  // Rank 0's runs in order, then the other ranks' runs (after the drops) in order: the logits rows come back so.
  local_runs_.clear();
  for (size_t i = 0; i < runs_.size(); ++i)
    if (run_seqs_[i]->rank == 0) rows_[i] = static_cast<int64_t>(local_runs_.size()), local_runs_.push_back(runs_[i]);
  int64_t row = static_cast<int64_t>(local_runs_.size());
  for (size_t i = 0; i < runs_.size(); ++i) {
    Seq& s = *run_seqs_[i];
    if (s.rank == 0) continue;
    rows_[i] = row++;
    const int32_t* ids = runs_[i].ids;
    cell_runs_.push_back(CellRun{s.slot, s.rank, s.fresh, false, std::vector<int32_t>(ids, ids + runs_[i].T), true, false,
                                 s.blocks});
    s.fresh = false;
  }
  const Status st = cell_->step_held(local_runs_, cell_runs_, logits_);
  cell_runs_.clear();
  if (!st.is_ok()) {
    fail_cell(st);
    return false;
  }
  for (size_t i = 0; i < runs_.size(); ++i)  // the ledger's count of what the other rank now holds
    if (run_seqs_[i]->rank != 0) run_seqs_[i]->st.n_tokens += runs_[i].T;
  return true;
}

void Scheduler::fail_cell(const Status& st) {
  const std::string why = "the cell failed (a rank is lost or cannot be reached): " + st.message();
  std::deque<GenerationRequest> queued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failure_ = why;
    queued.swap(inbox_);
  }
  ready_ = false;
  failed_ = true;
  GenerationEvent ev;
  ev.finish = FinishReason::kError;
  ev.error = why;
  for (auto& r : queued)
    if (r.on_event) r.on_event(ev);
  for (auto& s : running_)
    if (s) finish(*s, FinishReason::kError, why);
  for (auto& s : waiting_) finish(*s, FinishReason::kError, why);
  running_.clear();
  waiting_.clear();
}

// The next boundary where this sequence's prefill must stop so a snapshot can be taken (0: none).
int64_t Scheduler::next_cut(const Seq& s) const {
  int64_t cut = 0;
  for (size_t i = 1; i < s.cuts.size(); i += 2)
    if (s.cuts[i] > s.st.n_tokens) {
      cut = s.cuts[i];
      break;
    }
  for (int64_t at : s.shares)
    if (at > s.st.n_tokens) return cut > 0 ? std::min(cut, at) : at;
  return cut;
}

void Scheduler::loop(std::stop_token stop) {
  while (!stop.stop_requested() && !failed_) {
    const bool idle = running_.empty() && waiting_.empty();
    take_inbox(idle, stop);
    if (stop.stop_requested()) break;
    const bool worked = step();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (prefix_) prefix_stats_ = prefix_->stats();
      waiting_count_ = static_cast<int64_t>(waiting_.size());
      waiting_tokens_ = waiting_prompt_tokens();
      running_count_ = static_cast<int64_t>(running_.size());
      publish_pools_locked();
    }
    if (!worked && !running_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Shutdown: everything still here is cancelled so every client gets a final event.
  for (auto& s : running_)
    if (s) finish(*s, FinishReason::kCancelled);
  for (auto& s : waiting_) finish(*s, FinishReason::kCancelled);
  for (auto* m : {&parked_, &reserved_})
    for (auto& [id, s] : *m) finish(*s, FinishReason::kCancelled);
  parked_.clear();
  reserved_.clear();
  running_.clear();
  waiting_.clear();
  // A cell's followers free what they still hold and leave their loop (not after a failed step: the cell's
  // collective state is unknown).
  if (cell_ != nullptr && !failed_ && !cell_runs_.empty()) {
    runs_.clear();
    run_seqs_.clear();
    forward();
  }
  if (cell_ != nullptr && !failed_)
    if (Status st = cell_->finish(); !st.is_ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      failure_ = "the cell failed while stopping: " + st.message();
    }
}

}  // namespace kestrel
