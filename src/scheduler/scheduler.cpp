#include "scheduler/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace kestrel {

using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<Scheduler>> Scheduler::create(Engine& engine, const SchedulerConfig& cfg) {
  if (cfg.prefill_chunk < 1 || cfg.prefill_chunk > cfg.max_batch_tokens)
    return invalid_argument("scheduler: prefill chunk must be in 1..max batch tokens");
  if (cfg.max_context < 2 || cfg.max_waiting < 0) return invalid_argument("scheduler: bad limits");
  auto s = std::unique_ptr<Scheduler>(new Scheduler(engine, cfg));
  CachePoolConfig pc = cfg.cache;
  pc.max_seq_tokens = cfg.max_context;
  auto pools = CachePools::create(engine.model().cache_geometry(), pc);
  if (!pools) return pools.error();
  s->pools_ = std::move(*pools);
  if (s->pools_->num_blocks() * s->pools_->page_tokens() < cfg.max_context)
    return invalid_argument("cache: " + std::to_string(s->pools_->num_blocks() * s->pools_->page_tokens()) +
                            " tokens of MLA pages cannot hold one max-context sequence (" +
                            std::to_string(cfg.max_context) + "); raise --cache-mib or lower --max-context");
  s->running_.reserve(static_cast<size_t>(pc.max_slots));
  s->thread_ = std::jthread([p = s.get()](std::stop_token st) { p->loop(st); });
  s->ready_ = true;
  return s;
}

Scheduler::~Scheduler() {
  thread_.request_stop();
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
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_) return unavailable("the server is shutting down");
  if (static_cast<int64_t>(inbox_.size()) + waiting_count_ >= cfg_.max_waiting)
    return unavailable("the waiting queue is full (" + std::to_string(cfg_.max_waiting) + " requests)");
  req.id = next_id_++;
  const uint64_t id = req.id;
  inbox_.push_back(std::move(req));
  cv_.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

ServiceStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  ServiceStats s;
  s.waiting = waiting_count_ + static_cast<int64_t>(inbox_.size());
  s.running = running_count_;
  s.kv_blocks_used = blocks_used_;
  s.kv_blocks_total = pools_->num_blocks();
  s.state_slots_used = slots_used_;
  s.state_slots_total = pools_->num_slots();
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
  s.step_sequences_buckets = metrics_.step_sequences.bounds();
  s.step_sequences_counts = metrics_.step_sequences.counts();
  s.step_sequences_sum = metrics_.step_sequences.sum();
  s.steps_total = metrics_.step_sequences.n();
  s.step_sequences_max = metrics_.step_sequences_max;
  return s;
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
  thread_.request_stop();
  cv_.notify_all();
}

// Moves new requests into waiting_ and applies cancels. Blocks (when asked) until there is work.
// The taken requests and cancels are swapped into members (emptied again below), not into locals: a
// default-constructed std::deque allocates, and this runs once per step.
bool Scheduler::take_inbox(bool block, std::stop_token& stop) {
  std::deque<GenerationRequest>& in = taken_requests_;
  std::vector<uint64_t>& cancels = taken_cancels_;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (block) cv_.wait(lk, [&] { return stop.stop_requested() || !inbox_.empty() || !cancels_.empty(); });
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  const auto now = Clock::now();
  for (auto& r : in) {
    auto s = std::make_unique<Seq>();
    s->arrival = now;
    s->tokens.reserve(static_cast<size_t>(std::min<int64_t>(
        cfg_.max_context, static_cast<int64_t>(r.prompt.size()) + std::max(0, r.params.max_new_tokens) + 1)));
    s->tokens = r.prompt;
    s->prompt_len = static_cast<int64_t>(r.prompt.size());
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
  }
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  const bool any = !in.empty() || !cancels.empty();
  in.clear();
  cancels.clear();
  return any;
}

void Scheduler::admit() {
  while (!waiting_.empty() && pools_->free_slots() > 0) {
    std::unique_ptr<Seq> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->slot = *pools_->acquire_slot(s->st);
    // The block list never reallocates while decoding (the pools reserve the page tables likewise).
    s->blocks.reserve(static_cast<size_t>(pools_->blocks_for(cfg_.max_context)));
    running_.push_back(std::move(s));
  }
}

void Scheduler::release(Seq& s) {
  if (s.slot >= 0) pools_->release(s.st, s.slot, s.blocks);
  s.slot = -1;
  // Publish immediately so stats are current by the time the client sees the final event.
  std::lock_guard<std::mutex> lk(mu_);
  blocks_used_ = pools_->num_blocks() - pools_->free_blocks();
  slots_used_ = pools_->num_slots() - pools_->free_slots();
}

// Emits the final event and frees the sequence's cache. The caller drops it from its list.
void Scheduler::finish(Seq& s, FinishReason r, const std::string& error) {
  release(s);
  GenerationEvent ev;
  ev.finish = r;
  ev.error = error;
  ev.prompt_tokens = static_cast<int>(s.prompt_len);
  ev.completion_tokens = s.generated;
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.finished++;
    if (r == FinishReason::kCancelled) metrics_.cancelled++;
  }
  if (s.req.on_event) s.req.on_event(ev);
  s.req.on_event = nullptr;
  // Mark for removal from running_ (pointer compare in callers).
  for (auto& p : running_)
    if (p.get() == &s) p.reset();
}

// Recompute-style preemption: drop the cache, keep the tokens (prompt + generated so far); the
// sequence goes back to the front of the queue and re-prefills when a slot frees up.
void Scheduler::preempt(Seq& s) {
  release(s);
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
  s.proc->observe_generated(tok);
  GenerationEvent& ev = token_event_;  // reused: `top` keeps its capacity, so no allocation per token
  ev.token = tok;
  ev.logprob = 0.0f;
  ev.top.clear();
  ev.step_sequences = static_cast<int>(runs_.size());
  if (s.req.params.top_logprobs >= 0)
    ev.logprob = LogitsProcessor::logprob_of(logits, tok, s.req.params.top_logprobs, ev.top, lp_scratch_);
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
  const auto& stops = s.req.params.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) return finish(s, FinishReason::kStop);
  if (s.generated >= s.req.params.max_new_tokens || static_cast<int64_t>(s.tokens.size()) >= cfg_.max_context)
    return finish(s, FinishReason::kLength);
}

// One scheduling step; returns false when there was nothing to run.
bool Scheduler::step() {
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
    while (!pools_->grow(s.st, s.blocks, s.st.n_tokens + T)) {
      Seq* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it)
        if (*it && it->get() != &s && std::find(run_seqs_.begin(), run_seqs_.end(), it->get()) == run_seqs_.end()) {
          victim = it->get();
          break;
        }
      if (victim == nullptr) return false;
      preempt(*victim);
    }
    runs_.push_back(SeqRun{s.tokens.data() + s.st.n_tokens, T, &s.st, false});
    run_seqs_.push_back(&s);
    budget -= T;
    return true;
  };
  for (auto& p : running_)
    if (p && p->pending() == 1 && budget >= 1) plan(*p, 1);
  for (auto& p : running_) {
    if (!p || p->pending() <= 1) continue;
    const int64_t T = std::min(cfg_.prefill_chunk, p->pending());
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
    running_count_ = static_cast<int64_t>(running_.size());
    blocks_used_ = pools_->num_blocks() - pools_->free_blocks();
    slots_used_ = pools_->num_slots() - pools_->free_slots();
  }
  if (runs_.empty()) return false;

  engine_.model().forward_batch(runs_, logits_);
  const int64_t V = engine_.config().text.vocab_size;
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < run_seqs_.size(); ++i)
    if (run_seqs_[i]->generated == 0) prompt_tokens += runs_[i].T;
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.prompt_tokens += prompt_tokens;
    const auto n = static_cast<int64_t>(runs_.size());
    metrics_.step_sequences.observe(static_cast<double>(n));
    metrics_.step_sequences_max = std::max(metrics_.step_sequences_max, n);
  }
  for (size_t i = 0; i < run_seqs_.size(); ++i) {
    Seq& s = *run_seqs_[i];
    if (s.pending() == 0) sample_and_emit(s, std::span<float>(logits_.data() + static_cast<int64_t>(i) * V, static_cast<size_t>(V)));
  }
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  return true;
}

void Scheduler::loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    const bool idle = running_.empty() && waiting_.empty();
    take_inbox(idle, stop);
    if (stop.stop_requested()) break;
    const bool worked = step();
    {
      std::lock_guard<std::mutex> lk(mu_);
      waiting_count_ = static_cast<int64_t>(waiting_.size());
      running_count_ = static_cast<int64_t>(running_.size());
      blocks_used_ = pools_->num_blocks() - pools_->free_blocks();
      slots_used_ = pools_->num_slots() - pools_->free_slots();
    }
    if (!worked && !running_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Shutdown: everything still here is cancelled so every client gets a final event.
  for (auto& s : running_)
    if (s) finish(*s, FinishReason::kCancelled);
  for (auto& s : waiting_) finish(*s, FinishReason::kCancelled);
  running_.clear();
  waiting_.clear();
}

}  // namespace kestrel
