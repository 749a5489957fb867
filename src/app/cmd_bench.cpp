#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "app/args.h"
#include "app/bench_cell.h"
#include "app/bench_protocol.h"
#include "app/commands.h"
#include "app/default_model.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace kestrel::app {

namespace {
// CPU seconds of the whole process (all threads): with one thread it is the work itself, far less
// sensitive than wall time to other jobs sharing the machine.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}
}  // namespace

namespace {
int fail_msg(const Status& s) {
  std::fprintf(stderr, "kestrel bench: %s\n", s.message().c_str());
  return 1;
}

// --pp N --tg M --reps R [--warmup W]: llama-bench's pp/tg protocol (bench_protocol.h).
int bench_pp_tg(const Args& a, const std::string& dir) {
  PpTgOptions o;
  auto pp = a.integer("pp"), tg = a.integer("tg"), reps = a.integer("reps"), warm = a.integer("warmup"),
       chunk = a.integer("chunk");
  if (!pp || !tg || !reps || !warm || !chunk)
    return usage_error("bench", invalid_argument("--pp, --tg, --reps, --warmup, --chunk take integers"));
  o.pp = *pp, o.tg = *tg, o.reps = *reps, o.warmup = *warm, o.chunk = *chunk;
  auto kv = kv_cache_dtype_flag(a);
  if (!kv) return usage_error("bench", kv.error());
  o.kv = *kv;
  auto eng = Engine::load(dir);
  if (!eng) return fail_msg(eng.error());
  auto r = run_pp_tg(**eng, o);
  if (!r) return fail_msg(r.error());
  nlohmann::json j = *r;
  j["model"] = dir, j["threads"] = omp_get_max_threads(), j["peak_rss_mib"] = peak_rss_mib();
  if (a.has("json")) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model    %s\nthreads  %d\n", dir.c_str(), omp_get_max_threads());
  for (const char* k : {"pp", "tg"})
    if (j.contains(k))
      std::printf("%s%-6lld %8.2f ± %.2f tok/s (%zu reps)\n", k, static_cast<long long>(j[k]["n_tokens"].get<int64_t>()),
                  j[k]["tok_s_mean"].get<double>(), j[k]["tok_s_sd"].get<double>(), j[k]["seconds"].size());
  return 0;
}

// --gate-ids LIST --gate-gen G --gate-out FILE: greedy continuation + its logits, for the comparison gate.
int bench_gate(const Args& a, const std::string& dir) {
  if (!a.has("gate-ids") || !a.has("gate-out"))
    return usage_error("bench", invalid_argument("--gate-ids and --gate-out go together"));
  auto ids = parse_id_list(a.str("gate-ids"));
  if (!ids) return usage_error("bench", ids.error());
  auto gen = a.integer("gate-gen");
  if (!gen || *gen < 1 || *gen > 4096) return usage_error("bench", invalid_argument("--gate-gen must be an integer in 1..4096"));
  auto kv = kv_cache_dtype_flag(a);
  if (!kv) return usage_error("bench", kv.error());
  auto eng = Engine::load(dir);
  if (!eng) return fail_msg(eng.error());
  auto r = run_gate(**eng, *ids, *gen, a.str("gate-out"), *kv);
  if (!r) return fail_msg(r.error());
  std::printf("%s\n", r->dump().c_str());
  return 0;
}
}  // namespace

// Prefill and decode throughput and peak memory on a named preset (generated on first use) or a
// checkpoint directory.
int cmd_bench(const std::vector<std::string>& argv) {
  auto fail = [](const Status& s) { std::fprintf(stderr, "kestrel bench: %s\n", s.message().c_str()); return 1; };
  int exit_code = 0;
  auto a = Args::parse("bench", argv, exit_code);
  if (!a) return exit_code;
  if (a->has("threads")) {
    auto t = a->integer_or("threads", 0);
    if (!t || *t < 1 || *t > 1024) return usage_error("bench", invalid_argument("--threads must be an integer in 1..1024"));
    omp_set_num_threads(static_cast<int>(*t));
  }
  auto ep = a->integer("ep");
  if (!ep) return usage_error("bench", ep.error());
  auto lo = liveness_flags(*a);
  if (!lo) return usage_error("bench", lo.error());
  auto tp = a->integer("tp");
  if (!tp) return usage_error("bench", tp.error());
  auto launch = open_cell(*ep, *tp);
  if (!launch) return usage_error("bench", launch.error());
  CellLaunch* cl = launch->get();
  if (Status s = apply_numa(*a, cl, a->has("quiet")); !s.is_ok()) {  // before any thread pool or weight page
    if (cl != nullptr) cell_exit(*cl, s);
    return usage_error("bench", s);
  }
  std::unique_ptr<dist::Liveness> liveness;  // a frozen or lost rank ends the cell at the deadline
  if (cl != nullptr) liveness = open_liveness(*cl, *lo, /*report_health=*/false);
  // In a cell rank 0 resolves (and maybe generates) the preset model before the others look for it.
  if (cl != nullptr && cl->shard.rank != 0 && !cl->comm->barrier().is_ok()) return 1;
  std::string dir = a->str("model");
  const std::string preset = a->str("preset");
  if (dir.empty()) {
    auto d = ensure_preset_model(preset, cl == nullptr || cl->shard.rank == 0);
    if (!d) return fail(d.error());
    dir = *d;
  }
  if (cl != nullptr && cl->shard.rank == 0 && !cl->comm->barrier().is_ok()) return 1;
  if (cl != nullptr) {
    if (a->has("gate-out") || a->has("gate-ids") || a->has("pp") || a->has("tg") || a->has("reps") || a->has("context"))
      return usage_error("bench", unsupported("--ep runs the cell bench (--prompt, --gen, --chunk, --batch); the gate, "
                                              "pp/tg and --context modes are single-process"));
    return bench_cell(*a, dir, *cl);
  }
  if (a->has("gate-out") || a->has("gate-ids")) return bench_gate(*a, dir);
  if (a->has("pp") || a->has("tg") || a->has("reps")) return bench_pp_tg(*a, dir);
  auto prompt = a->integer("prompt");
  auto gen = a->integer("gen");
  auto chunk = a->integer("chunk");
  auto batch = a->integer("batch");
  auto context = a->integer("context");
  if (!prompt || !gen || !chunk || !batch || *prompt < 1 || *gen < 1 || *chunk < 1 || *batch < 1 || *batch > 256)
    return usage_error("bench", invalid_argument("--prompt, --gen, --chunk, --batch must be positive integers (batch ≤ 256)"));
  if (!context || *context < 0 || *context > (int64_t{1} << 24))
    return usage_error("bench", invalid_argument("--context must be an integer in 0..16777216"));
  auto kv = kv_cache_dtype_flag(*a);
  if (!kv) return usage_error("bench", kv.error());
  const double rss0 = peak_rss_mib();
  auto eng = Engine::load(dir);
  if (!eng) return fail(eng.error());
  Engine& e = **eng;
  const int vocab = e.config().text.vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(*prompt));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
  SequenceState seq = e.new_sequence(*kv);
  // --context N: N synthetic cached tokens first (see KimiModel::fill_synthetic_context), so the
  // timed prefill/decode below run at depth N without an O(N²) warm-up.
  if (*context > 0) {
    // Warm-up on a throwaway sequence: faults the mmapped weights in and grows scratch buffers, so
    // the timings below are steady state (the depth comparison needs that; plain runs keep the
    // historical cold-start behaviour).
    SequenceState warm = e.new_sequence(*kv);
    if (auto w = e.prefill(warm, ids, *chunk); !w) return fail(w.error());
    e.model().fill_synthetic_context(seq, *context, 1);
    e.reserve(seq, *context + *prompt + *gen);
  }
  const double idx0 = e.model().indexer_seconds();
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = e.prefill(seq, ids, *chunk);
  if (!logits) return fail(logits.error());
  const auto t1 = std::chrono::steady_clock::now();
  const double c1 = cpu_seconds();
  const double idx_prefill = e.model().indexer_seconds() - idx0;
  int32_t tok = Sampler::argmax(*logits);
  for (long long i = 0; i < *gen; ++i) {
    auto l = e.decode(seq, tok);
    if (!l) return fail(l.error());
    tok = Sampler::argmax(*l);
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double c2 = cpu_seconds();
  const double idx_decode = e.model().indexer_seconds() - idx0 - idx_prefill;
  const double pp = static_cast<double>(*prompt) / std::chrono::duration<double>(t1 - t0).count();
  const double tg = static_cast<double>(*gen) / std::chrono::duration<double>(t2 - t1).count();
  // Batched decode: B sequences (short distinct prompts) decoded in lockstep with one batched
  // forward per step (what the scheduler does at concurrency B); aggregate tokens/s.
  double tg_batch = 0, cpu_ms_batch = 0;
  if (*batch > 1) {
    std::vector<SequenceState> seqs;
    std::vector<SeqRun> runs;
    std::vector<int32_t> toks(static_cast<size_t>(*batch));
    std::vector<float> logits_b;
    for (long long b = 0; b < *batch; ++b) {
      seqs.push_back(e.new_sequence(*kv));
      std::vector<int32_t> p(16);
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>((b * 131 + static_cast<long long>(i) * 7 + 1) % vocab);
      auto l = e.prefill(seqs.back(), p, 0);
      if (!l) return fail(l.error());
      toks[static_cast<size_t>(b)] = Sampler::argmax(*l);
    }
    const double cb0 = cpu_seconds();
    const auto tb0 = std::chrono::steady_clock::now();
    for (long long step = 0; step < *gen; ++step) {
      runs.clear();
      for (long long b = 0; b < *batch; ++b) runs.push_back(SeqRun{&toks[static_cast<size_t>(b)], 1, &seqs[static_cast<size_t>(b)], false});
      e.model().forward_batch(runs, logits_b);
      for (long long b = 0; b < *batch; ++b)
        toks[static_cast<size_t>(b)] = Sampler::argmax(std::span<const float>(logits_b.data() + b * vocab, static_cast<size_t>(vocab)));
    }
    tg_batch = static_cast<double>(*gen * *batch) / std::chrono::duration<double>(std::chrono::steady_clock::now() - tb0).count();
    cpu_ms_batch = 1e3 * (cpu_seconds() - cb0) / static_cast<double>(*gen * *batch);
  }
  const CacheGeometry& g = e.model().cache_geometry();
  nlohmann::json j = {{"model", dir}, {"preset", a->has("model") ? "" : preset}, {"threads", omp_get_max_threads()},
                      {"prompt_tokens", *prompt}, {"gen_tokens", *gen}, {"prefill_tok_s", pp}, {"decode_tok_s", tg},
                      {"peak_rss_mib", peak_rss_mib()}, {"rss_before_load_mib", rss0}, {"batch", *batch},
                      {"batched_decode_tok_s", tg_batch}, {"context", *context},
                      {"kv_cache_dtype", std::string(kv_cache_dtype_name(*kv))},
                      {"mla_bytes_per_token", g.mla_bytes_per_token(*kv)},
                      {"indexer_bytes_per_token", g.index_bytes_per_token()},
                      {"kda_slot_bytes_per_request", g.slot_floats() * 4},
                      {"prefix_snapshot_bytes", g.slot_floats() * 4},  // one slot's state, kept at rest as is
                      {"indexer_ms_per_prefill_token", 1e3 * idx_prefill / static_cast<double>(*prompt)},
                      {"indexer_ms_per_decode_token", 1e3 * idx_decode / static_cast<double>(*gen)},
                      {"prefill_cpu_ms_per_token", 1e3 * (c1 - c0) / static_cast<double>(*prompt)},
                      {"decode_cpu_ms_per_token", 1e3 * (c2 - c1) / static_cast<double>(*gen)},
                      {"batched_decode_cpu_ms_per_token", cpu_ms_batch}};
  if (a->has("json")) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model        %s\nthreads      %d\nprefill      %lld tokens: %.2f tok/s\ndecode       %lld tokens: %.2f tok/s\n"
                "peak RSS     %.1f MiB\n",
                dir.c_str(), omp_get_max_threads(), *prompt, pp, *gen, tg, peak_rss_mib());
    std::printf("cpu time     %.1f ms/token prefill, %.1f ms/token decode (all threads)\n",
                1e3 * (c1 - c0) / static_cast<double>(*prompt), 1e3 * (c2 - c1) / static_cast<double>(*gen));
    std::printf("context      %lld cached tokens before the timed prefill\n"
                "cache        MLA pages %lld B/token (%s), indexer pages %lld B/token, KDA slot %.1f KiB/request (and "
                "per prefix-cache snapshot)\n",
                *context, static_cast<long long>(g.mla_bytes_per_token(*kv)), std::string(kv_cache_dtype_name(*kv)).c_str(),
                static_cast<long long>(g.index_bytes_per_token()),
                static_cast<double>(g.slot_floats() * 4) / 1024.0);
    if (g.index_bytes_per_token() > 0)
      std::printf("indexer      %.3f CPU ms/token in prefill, %.3f CPU ms/token in decode\n", 1e3 * idx_prefill / static_cast<double>(*prompt),
                  1e3 * idx_decode / static_cast<double>(*gen));
    if (*batch > 1)
      std::printf("batch decode %lld sequences: %.2f tok/s aggregate (%.2fx single; %.2f CPU-ms/token)\n", *batch, tg_batch,
                  tg_batch / tg, cpu_ms_batch);
  }
  return 0;
}

}  // namespace kestrel::app
