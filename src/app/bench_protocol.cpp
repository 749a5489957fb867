#include "app/bench_protocol.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "runtime/sampler.h"

namespace kestrel::app {

namespace {
using Clock = std::chrono::steady_clock;

// CPU seconds of the whole process (all threads): cpu / wall of a run = cores it actually got, the sign
// of a contended machine.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timed {
  double wall = 0, cpu = 0;
};

nlohmann::json summarize(int64_t n_tokens, const std::vector<Timed>& runs) {
  std::vector<double> seconds, cores;
  for (const Timed& r : runs) seconds.push_back(r.wall), cores.push_back(r.cpu / r.wall);
  // Per-repetition rates, then their mean and sample standard deviation (llama-bench's avg_ts/stddev_ts).
  std::vector<double> ts;
  double mean = 0;
  for (double s : seconds) ts.push_back(static_cast<double>(n_tokens) / s), mean += ts.back();
  mean /= static_cast<double>(ts.size());
  double var = 0;
  for (double t : ts) var += (t - mean) * (t - mean);
  const double sd = ts.size() > 1 ? std::sqrt(var / static_cast<double>(ts.size() - 1)) : 0.0;
  return {{"n_tokens", n_tokens}, {"seconds", seconds}, {"tok_s", ts}, {"tok_s_mean", mean}, {"tok_s_sd", sd},
          {"cores_used", cores}};
}

// pp: one prefill of the whole prompt, in chunks of `chunk` tokens, on a fresh sequence.
Result<Timed> time_pp(Engine& e, const std::vector<int32_t>& ids, KvCacheDtype kv, int64_t chunk) {
  SequenceState seq = e.new_sequence(kv);
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  auto l = e.prefill(seq, ids, chunk);
  if (!l) return l.error();
  return Timed{std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds() - c0};
}

// tg: n single-token steps from an empty sequence (the first is a one-token prefill: nothing is cached
// yet), each fed the previous greedy token, like llama-bench's tg (one llama_decode per token).
Result<Timed> time_tg(Engine& e, int64_t n, int32_t first, std::vector<float>& logits, KvCacheDtype kv) {
  SequenceState seq = e.new_sequence(kv);
  e.reserve(seq, n);
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  auto l = e.prefill(seq, std::span<const int32_t>(&first, 1), 1);
  if (!l) return l.error();
  int32_t tok = Sampler::argmax(*l);
  for (int64_t i = 1; i < n; ++i) {
    if (Status s = e.decode_into(seq, tok, logits); !s.is_ok()) return s;
    tok = Sampler::argmax(logits);
  }
  return Timed{std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds() - c0};
}
}  // namespace

std::vector<int32_t> bench_prompt_ids(int64_t n, int vocab, int64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  const size_t shift = static_cast<size_t>(salt) * 104729;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13 + shift) % static_cast<size_t>(vocab));
  return ids;
}

Result<nlohmann::json> run_pp_tg(Engine& e, const PpTgOptions& o) {
  if (o.pp < 0 || o.tg < 0 || (o.pp == 0 && o.tg == 0) || o.reps < 1 || o.warmup < 0 || o.chunk < 1)
    return invalid_argument("--pp/--tg must be ≥ 0 (not both 0), --reps ≥ 1, --warmup ≥ 0, --chunk ≥ 1");
  const int vocab = e.config().text.vocab_size;
  std::vector<float> logits;
  // Every prefill (warm-ups and repetitions) gets a prompt of its own, so none reuses what an earlier one left
  // behind (MLA keeps the up-projected keys of the rows it last expanded, reused where the rows are the same):
  // each repetition is a cold prefill of new text, as llama-bench's is after it clears its cache.
  for (int64_t w = 0; w < o.warmup; ++w) {  // faults the mmapped weights in, grows scratch buffers
    if (auto s = time_pp(e, bench_prompt_ids(std::max<int64_t>(o.pp, 32), vocab, o.reps + w), o.kv, o.chunk); !s) return s.error();
    if (auto s = time_tg(e, 1, 13, logits, o.kv); !s) return s.error();
  }
  nlohmann::json j = nlohmann::json::object();
  if (o.pp > 0) {
    std::vector<Timed> secs;
    for (int64_t r = 0; r < o.reps; ++r) {
      auto s = time_pp(e, bench_prompt_ids(o.pp, vocab, r), o.kv, o.chunk);
      if (!s) return s.error();
      secs.push_back(*s);
    }
    j["pp"] = summarize(o.pp, secs);
  }
  if (o.tg > 0) {
    std::vector<Timed> secs;
    for (int64_t r = 0; r < o.reps; ++r) {
      auto s = time_tg(e, o.tg, 13, logits, o.kv);
      if (!s) return s.error();
      secs.push_back(*s);
    }
    j["tg"] = summarize(o.tg, secs);
  }
  return j;
}

Result<nlohmann::json> run_gate(Engine& e, const std::vector<int32_t>& prompt, int64_t gen, const std::string& logits_path,
                                KvCacheDtype kv) {
  const int vocab = e.config().text.vocab_size;
  if (gen < 1) return invalid_argument("--gate-gen must be ≥ 1");
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab) return invalid_argument("gate prompt id " + std::to_string(id) + " outside the vocabulary");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(logits_path.c_str(), "wb"), &std::fclose);
  if (!f) return io_error("cannot write " + logits_path);
  SequenceState seq = e.new_sequence(kv);
  auto l = e.prefill(seq, prompt, static_cast<int64_t>(prompt.size()));
  if (!l) return l.error();
  std::vector<float> cur = std::move(*l);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < gen; ++i) {
    if (std::fwrite(cur.data(), sizeof(float), cur.size(), f.get()) != cur.size())
      return io_error("short write to " + logits_path);
    out.push_back(Sampler::argmax(cur));
    if (i + 1 < gen)
      if (Status s = e.decode_into(seq, out.back(), cur); !s.is_ok()) return s;
  }
  return nlohmann::json{{"prompt_tokens", prompt.size()}, {"generated", out}, {"vocab", vocab}, {"logits_file", logits_path}};
}

}  // namespace kestrel::app
