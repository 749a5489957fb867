#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "app/args.h"
#include "app/commands.h"
#include "app/default_model.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace kestrel::app {

namespace {
double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}
}  // namespace

// Prefill and decode throughput and peak memory on a named preset (generated on first use) or a
// checkpoint directory.
int cmd_bench(const std::vector<std::string>& argv) {
  auto fail = [](const Status& s) { std::fprintf(stderr, "kestrel bench: %s\n", s.message().c_str()); return 1; };
  auto a = Args::parse(argv, {"model", "preset", "prompt", "gen", "chunk"}, {"json"});
  if (!a) return fail(a.error());
  std::string dir = a->str("model");
  const std::string preset = a->str("preset", "k3-bench");
  if (dir.empty()) {
    auto d = ensure_preset_model(preset, true);
    if (!d) return fail(d.error());
    dir = *d;
  }
  auto prompt = a->integer("prompt", 512);
  auto gen = a->integer("gen", 64);
  auto chunk = a->integer("chunk", 512);
  if (!prompt || !gen || !chunk || *prompt < 1 || *gen < 1 || *chunk < 1)
    return fail(invalid_argument("--prompt, --gen, --chunk must be positive integers"));
  const double rss0 = peak_rss_mib();
  auto eng = Engine::load(dir);
  if (!eng) return fail(eng.error());
  Engine& e = **eng;
  const int vocab = e.config().text.vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(*prompt));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
  SequenceState seq = e.new_sequence();
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = e.prefill(seq, ids, *chunk);
  if (!logits) return fail(logits.error());
  const auto t1 = std::chrono::steady_clock::now();
  int32_t tok = Sampler::argmax(*logits);
  for (long long i = 0; i < *gen; ++i) {
    auto l = e.decode(seq, tok);
    if (!l) return fail(l.error());
    tok = Sampler::argmax(*l);
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double pp = static_cast<double>(*prompt) / std::chrono::duration<double>(t1 - t0).count();
  const double tg = static_cast<double>(*gen) / std::chrono::duration<double>(t2 - t1).count();
  nlohmann::json j = {{"model", dir}, {"preset", a->has("model") ? "" : preset}, {"threads", omp_get_max_threads()},
                      {"prompt_tokens", *prompt}, {"gen_tokens", *gen}, {"prefill_tok_s", pp}, {"decode_tok_s", tg},
                      {"peak_rss_mib", peak_rss_mib()}, {"rss_before_load_mib", rss0}};
  if (a->has("json")) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model        %s\nthreads      %d\nprefill      %lld tokens: %.2f tok/s\ndecode       %lld tokens: %.2f tok/s\n"
                "peak RSS     %.1f MiB\n",
                dir.c_str(), omp_get_max_threads(), *prompt, pp, *gen, tg, peak_rss_mib());
  }
  return 0;
}

}  // namespace kestrel::app
