#include "app/bench_cell.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "dist/counting_communicator.h"
#include "plan/cell_plan.h"
#include "runtime/cell.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace kestrel::app {

namespace {
// What one rank contributes to the report.
enum Field { kWeight, kHeldSeqs, kHeldTokens, kMeasured, kComputed, kMoe, kTp, kFields };

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int bench_cell(const Args& a, const std::string& dir, CellLaunch& launch) {
  auto prompt = a.integer("prompt"), gen = a.integer("gen"), chunk = a.integer("chunk"), batch = a.integer("batch");
  auto kv = kv_cache_dtype_flag(a);
  if (Status bad = first_error(prompt, gen, chunk, batch, kv); !bad.is_ok()) cell_exit(launch, bad);
  if (*prompt < 1 || *gen < 1 || *chunk < 1 || *batch < 1 || *batch > 256)
    cell_exit(launch, invalid_argument("--prompt, --gen, --chunk, --batch must be positive integers (batch ≤ 256)"));
  dist::CountingCommunicator counting(*launch.comm);
  launch.shard.comm = &counting;
  auto eng = Engine::load(dir, &launch.shard);
  if (!eng) cell_exit(launch, eng.error());
  Model& model = (*eng)->model();
  Cell cell(model, counting, {}, *kv);
  const int me = launch.shard.rank, P = launch.shard.size;
  const int64_t V = model.config().text.vocab_size, B = *batch;
  auto computed_now = [&] {
    return launch.shard.traffic.total() + cell.traffic().plan_bytes + cell.traffic().logits_bytes;
  };
  auto check = [&](const Status& s) {
    if (!s.is_ok()) cell_exit(launch, s);
  };

  // Phase 1, prefill: every sequence's next chunk in one step. Phase 2, decode: one token per sequence per
  // step. A barrier between them lets every rank snapshot its counters at the same point.
  double prefill_s = 0, decode_s = 0;
  uint64_t measured0 = 0, computed0 = 0, moe0 = 0, tp0 = 0;
  auto snapshot = [&] {
    check(launch.comm->barrier());
    const EpTraffic& t = launch.shard.traffic;
    measured0 = counting.sent_bytes(), computed0 = computed_now(), moe0 = t.total() - t.tp_total(), tp0 = t.tp_total();
  };
  if (me != 0) {
    check(cell.follow());
    snapshot();
    check(cell.follow());
  } else {
    std::vector<float> logits;
    std::vector<int32_t> tok(static_cast<size_t>(B));
    auto next_tokens = [&] {
      for (int64_t b = 0; b < B; ++b)
        tok[static_cast<size_t>(b)] = Sampler::argmax(std::span<const float>(logits.data() + b * V, static_cast<size_t>(V)));
    };
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < *prompt; s += *chunk) {
      std::vector<CellRun> runs;
      for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> ids;
        for (int64_t i = s; i < std::min(s + *chunk, *prompt); ++i)
          ids.push_back(static_cast<int32_t>((i * 7919 + 13 + b * 131) % V));
        runs.push_back(CellRun{static_cast<int32_t>(b), static_cast<int32_t>(b % P), s == 0, false, std::move(ids)});
      }
      check(cell.step(runs, logits));
    }
    next_tokens();
    prefill_s = since(t0);
    check(cell.finish());
    snapshot();
    const auto t1 = Clock::now();
    std::vector<CellRun> runs(static_cast<size_t>(B));
    for (int64_t i = 0; i < *gen; ++i) {
      for (int64_t b = 0; b < B; ++b)
        runs[static_cast<size_t>(b)] = CellRun{static_cast<int32_t>(b), static_cast<int32_t>(b % P), false, false,
                                               {tok[static_cast<size_t>(b)]}};
      check(cell.step(runs, logits));
      next_tokens();
    }
    decode_s = since(t1);
    check(cell.finish());
  }

  const CacheGeometry& g = model.cache_geometry();
  const uint64_t mine[kFields] = {model.bound_weight_bytes(),
                                  cell.held_sequences(),
                                  static_cast<uint64_t>(cell.held_tokens()),
                                  counting.sent_bytes() - measured0,
                                  computed_now() - computed0,
                                  launch.shard.traffic.total() - launch.shard.traffic.tp_total() - moe0,
                                  launch.shard.traffic.tp_total() - tp0};
  std::vector<uint64_t> all(static_cast<size_t>(kFields * P));
  std::vector<size_t> counts(static_cast<size_t>(P), kFields);
  check(launch.comm->all_gather_v<uint64_t>(std::span<const uint64_t>(mine, kFields), all, counts));
  if (me != 0) return 0;

  auto cfg = load_model_config(dir);
  if (!cfg) cell_exit(launch, cfg.error());
  auto expect = plan::make_cell_plan(*cfg, dir, P, B, *prompt + *gen, *kv, launch.shard.tp);
  if (!expect) cell_exit(launch, expect.error());
  const int64_t per_token = g.mla_bytes_per_token(*kv) + g.index_bytes_per_token(), slot = g.slot_floats() * 4;
  nlohmann::json ranks = nlohmann::json::array();
  uint64_t measured = 0, computed = 0, moe = 0, tpb = 0;
  for (int r = 0; r < P; ++r) {
    const uint64_t* f = all.data() + static_cast<size_t>(kFields * r);
    measured += f[kMeasured], computed += f[kComputed], moe += f[kMoe], tpb += f[kTp];
    ranks.push_back({{"rank", r},
                     {"weight_bytes", f[kWeight]},
                     {"planned_weight_bytes", expect->ranks[static_cast<size_t>(r)].weight_bytes},
                     {"sequences", f[kHeldSeqs]},
                     {"cache_bytes", static_cast<int64_t>(f[kHeldTokens]) * per_token + static_cast<int64_t>(f[kHeldSeqs]) * slot},
                     {"planned_cache_bytes", expect->ranks[static_cast<size_t>(r)].cache_bytes},
                     {"decode_bytes_sent_measured", f[kMeasured]},
                     {"decode_bytes_sent_computed", f[kComputed]}});
  }
  const double steps = static_cast<double>(*gen);
  nlohmann::json j = {{"model", dir},
                      {"ep", P},
                      {"tp", launch.shard.tp},
                      {"batch", B},
                      {"prompt_tokens", *prompt},
                      {"gen_tokens", *gen},
                      {"prefill_tok_s", static_cast<double>(B * *prompt) / prefill_s},
                      {"decode_tok_s", static_cast<double>(B * *gen) / decode_s},
                      {"decode_ms_per_step", 1e3 * decode_s / steps},
                      {"decode_step_bytes_measured", static_cast<double>(measured) / steps},
                      {"decode_step_bytes_computed", static_cast<double>(computed) / steps},
                      {"decode_step_moe_bytes", static_cast<double>(moe) / steps},
                      {"decode_step_tp_bytes", static_cast<double>(tpb) / steps},
                      {"decode_step_tp_bytes_planned", expect->tp_step_bytes},
                      {"decode_step_bytes_planned_uniform_routing", expect->step_bytes()},
                      {"decode_step_moe_bytes_planned_uniform_routing", expect->moe_step_bytes},
                      {"ranks", ranks}};
  if (a.has("json")) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("cell         %d ranks (TP groups of %d), %lld sequences of %lld prompt + %lld generated tokens\n"
              "prefill      %.2f tok/s aggregate\ndecode       %.2f tok/s aggregate, %.2f ms/step\n"
              "traffic      %.0f B/decode step measured, %.0f computed (%.0f MoE, %.0f TP); plan, uniform routing: "
              "%.0f\n",
              P, launch.shard.tp, static_cast<long long>(B), static_cast<long long>(*prompt), static_cast<long long>(*gen),
              j["prefill_tok_s"].get<double>(), j["decode_tok_s"].get<double>(), j["decode_ms_per_step"].get<double>(),
              static_cast<double>(measured) / steps, static_cast<double>(computed) / steps,
              static_cast<double>(moe) / steps, static_cast<double>(tpb) / steps, expect->step_bytes());
  for (const auto& r : ranks)
    std::printf("rank %-3d     weights %llu B (plan %lld), %llu sequences, cache %lld B\n", r["rank"].get<int>(),
                r["weight_bytes"].get<unsigned long long>(), r["planned_weight_bytes"].get<long long>(),
                r["sequences"].get<unsigned long long>(), r["cache_bytes"].get<long long>());
  return 0;
}

}  // namespace kestrel::app
