#include "cell_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>

#include "dist/counting_communicator.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "plan/cell_plan.h"
#include "runtime/cell.h"
#include "runtime/engine.h"

namespace kestrel::testing {
namespace {

std::vector<int32_t> prompt(int n, int vocab, int salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 131 + 7 + salt * 17) % vocab);
  return ids;
}

int32_t argmax(const float* row, int64_t V) {
  return static_cast<int32_t>(std::max_element(row, row + V) - row);
}

struct StepLog {
  std::vector<CellRun> runs;
  std::vector<float> logits;  // one row per run
};

// Rank 0 plans the workload and returns what each step ran and produced; other ranks follow and return {}.
std::vector<StepLog> run_workload(Cell& cell, int64_t V) {
  std::vector<StepLog> log;
  if (cell.rank() != 0) {
    EXPECT_TRUE(cell.follow().is_ok());
    return log;
  }
  const int P = cell.size();
  const std::vector<int> lengths = {1, 9, 23, 40, 64};
  const int S = static_cast<int>(lengths.size());
  std::vector<int32_t> next(static_cast<size_t>(S));
  auto step = [&](std::vector<CellRun> runs) {
    StepLog s{std::move(runs), {}};
    const Status st = cell.step(s.runs, s.logits);
    EXPECT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(s.logits.size(), s.runs.size() * static_cast<size_t>(V));
    if (s.logits.size() != s.runs.size() * static_cast<size_t>(V)) return;
    for (size_t i = 0; i < s.runs.size(); ++i)
      next[static_cast<size_t>(s.runs[i].seq)] = argmax(s.logits.data() + i * static_cast<size_t>(V), V);
    log.push_back(std::move(s));
  };
  auto decode_all = [&](std::vector<int> seqs) {
    std::vector<CellRun> runs;
    for (int q : seqs) runs.push_back(CellRun{q, q % P, false, false, {next[static_cast<size_t>(q)]}});
    step(std::move(runs));
  };
  std::vector<int> all(static_cast<size_t>(S));
  for (int q = 0; q < S; ++q) all[static_cast<size_t>(q)] = q;
  // Batched prefill of every sequence (each rank batches its own), then decode.
  std::vector<CellRun> pre;
  for (int q = 0; q < S; ++q) pre.push_back(CellRun{q, q % P, true, false, prompt(lengths[static_cast<size_t>(q)], static_cast<int>(V), q)});
  step(std::move(pre));
  for (int i = 0; i < 4; ++i) decode_all(all);
  decode_all({0});  // every other rank runs an empty batch
  // Sequence 1 restarts with a new prompt while the others decode (prefill and decode in one step).
  std::vector<CellRun> mixed;
  for (int q = 0; q < S; ++q)
    mixed.push_back(q == 1 ? CellRun{q, q % P, true, false, prompt(17, static_cast<int>(V), 99)}
                           : CellRun{q, q % P, false, false, {next[static_cast<size_t>(q)]}});
  step(std::move(mixed));
  for (int i = 0; i < 2; ++i) decode_all(all);
  EXPECT_TRUE(cell.finish().is_ok());
  return log;
}

// Loads this rank's shard of `dir` over `comm`.
std::unique_ptr<Model> load_shard(dist::Communicator& comm, const std::string& dir, ExpertShard& shard, int tp) {
  shard.comm = &comm;
  shard.rank = comm.rank();
  shard.size = comm.size();
  shard.tp = tp;
  auto m = load_model(dir, &shard);
  EXPECT_TRUE(m) << (m ? "" : m.error().message());
  return m ? std::move(*m) : nullptr;
}

// Every rank learns whether every rank succeeded (so no rank goes on alone after a failure).
bool all_ok(dist::Communicator& comm, bool ok) {
  std::vector<int> flags(static_cast<size_t>(comm.size()));
  std::vector<size_t> ones(flags.size(), 1);
  const int mine = ok ? 1 : 0;
  if (!comm.all_gather_v<int>(std::span<const int>(&mine, 1), flags, ones).is_ok()) return false;
  return std::all_of(flags.begin(), flags.end(), [](int f) { return f == 1; });
}

}  // namespace

void check_cell_matches_single_process(dist::Communicator& comm, const std::string& dir, int tp) {
  ExpertShard shard;
  auto model = load_shard(comm, dir, shard, tp);
  if (!all_ok(comm, model != nullptr)) return;
  const int64_t V = model->config().text.vocab_size;
  Cell cell(*model, comm);
  const auto log = run_workload(cell, V);
  if (tp > 1) {  // again, each sequence alone in its step: the same bits
    Cell again(*model, comm);
    if (comm.rank() != 0) {
      EXPECT_TRUE(again.follow().is_ok());
    } else {
      int differ = 0;
      std::vector<float> one;
      for (const StepLog& s : log)
        for (size_t i = 0; i < s.runs.size(); ++i) {
          ASSERT_TRUE(again.step({s.runs[i]}, one).is_ok());
          differ += std::memcmp(one.data(), s.logits.data() + i * static_cast<size_t>(V),
                                static_cast<size_t>(V) * sizeof(float)) != 0;
        }
      EXPECT_TRUE(again.finish().is_ok());
      EXPECT_EQ(differ, 0) << "logits rows of a second run, each sequence alone, differ from the batched run's";
    }
  }
  if (comm.rank() != 0) return;
  ASSERT_EQ(log.size(), 9u);

  // The same runs, each sequence alone, in one process with every expert.
  auto ref = load_model(dir);
  ASSERT_TRUE(ref) << ref.error().message();
  std::map<int32_t, SequenceState> seqs;
  std::vector<float> row;
  int rows = 0, differ = 0;
  double worst = 0;
  for (size_t s = 0; s < log.size(); ++s)
    for (size_t i = 0; i < log[s].runs.size(); ++i) {
      const CellRun& r = log[s].runs[i];
      if (r.reset) seqs.erase(r.seq);
      auto it = seqs.try_emplace(r.seq, (*ref)->new_sequence()).first;
      (*ref)->forward(r.ids.data(), static_cast<int64_t>(r.ids.size()), it->second, row);
      const float* got = log[s].logits.data() + i * static_cast<size_t>(V);
      ++rows;
      if (std::memcmp(got, row.data(), static_cast<size_t>(V) * sizeof(float)) != 0) {
        ++differ;
        double scale = 1.0, diff = 0.0;
        for (int64_t v = 0; v < V; ++v) {
          scale = std::max(scale, static_cast<double>(std::fabs(row[static_cast<size_t>(v)])));
          diff = std::max(diff, static_cast<double>(std::fabs(got[v] - row[static_cast<size_t>(v)])));
        }
        worst = std::max(worst, diff / scale);
      }
      EXPECT_EQ(argmax(got, V), argmax(row.data(), V)) << "step " << s << " sequence " << r.seq;
    }
  if (tp == 1) {
    EXPECT_EQ(differ, 0) << differ << " of " << rows << " logits rows differ from one process (max relative diff "
                         << worst << ") with EP " << comm.size();
  } else {
    EXPECT_LE(worst, kTpLogitTolerance) << differ << " of " << rows << " rows differ; EP " << comm.size() << " TP "
                                        << tp;
    EXPECT_GT(differ, 0) << "TP " << tp << " splits the down projection's sum: bit equality with one process "
                            "would mean the slices were not used";
    std::printf("[ tolerance ] EP %d TP %d: %d of %d logits rows differ from one process, max |diff| / max(1, "
                "max |logit|) = %.3g\n", comm.size(), tp, differ, rows, worst);
  }
  EXPECT_EQ(rows, 5 + 4 * 5 + 1 + 5 + 2 * 5);
}

void check_cell_weight_bytes(dist::Communicator& comm, const std::string& dir, int tp) {
  ExpertShard shard;
  auto model = load_shard(comm, dir, shard, tp);
  if (!all_ok(comm, model != nullptr)) return;
  const uint64_t mine = model->bound_weight_bytes();
  std::vector<uint64_t> bytes(static_cast<size_t>(comm.size()));
  std::vector<size_t> ones(bytes.size(), 1);
  ASSERT_TRUE(comm.all_gather_v<uint64_t>(std::span<const uint64_t>(&mine, 1), bytes, ones).is_ok());
  if (comm.rank() != 0) return;

  // Routed-expert bytes per expert id from the checkpoint, and what one process binds.
  auto full = load_model(dir);
  ASSERT_TRUE(full) << full.error().message();
  const int64_t E = (*full)->config().text.num_experts;
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck) << ck.error().message();
  std::vector<uint64_t> per_expert(static_cast<size_t>(E), 0);
  uint64_t routed = 0;
  const std::regex expert_re(R"(\.experts\.([0-9]+)\.)");
  for (const std::string& name : ck->names()) {
    std::smatch m;
    if (!std::regex_search(name, m, expert_re)) continue;
    auto t = ck->get(name, {}, {});
    ASSERT_TRUE(t) << t.error().message();
    const auto b = static_cast<uint64_t>(t->nbytes());
    per_expert[static_cast<size_t>(std::stoll(m[1]))] += b;
    routed += b;
  }
  ASSERT_GT(routed, 0u);
  // The tensor-parallel MLPs' tensors: a dense layer's mlp.{gate,up,down}_proj and the shared experts' (MTP
  // layers, which no model binds, left out).
  uint64_t tp_full = 0;
  const int layers = (*full)->config().text.num_hidden_layers;
  const std::regex tp_re(R"(layers\.([0-9]+)\.(mlp|[a-z_]+\.shared_experts)\.(gate|up|down)_proj\.)");
  for (const std::string& name : ck->names()) {
    std::smatch m;
    if (tp > 1 && std::regex_search(name, m, tp_re) && std::stoi(m[1]) < layers) tp_full += ck->tensor_bytes(name);
  }
  const uint64_t replicated = (*full)->bound_weight_bytes() - routed - tp_full;
  std::vector<uint64_t> tp_group_sum(static_cast<size_t>(comm.size() / tp), 0);
  uint64_t sum_routed = 0;
  for (int r = 0; r < comm.size(); ++r) {
    uint64_t want = replicated;
    for (int64_t e = 0; e < E; ++e)
      if (shard.owner(e, E) == r) want += per_expert[static_cast<size_t>(e)];
    const uint64_t got = bytes[static_cast<size_t>(r)];
    if (tp == 1) {
      EXPECT_EQ(got, want) << "rank " << r << " of " << comm.size();
      sum_routed += got - replicated;
    } else {  // want + this rank's slices, which are less than the whole tensors
      EXPECT_GE(got, want) << "rank " << r;
      EXPECT_LT(got, want + tp_full) << "rank " << r << " binds whole tensor-parallel tensors";
      tp_group_sum[static_cast<size_t>(r / tp)] += got - want;
      sum_routed += want - replicated;
    }
  }
  EXPECT_EQ(sum_routed, routed) << "every routed expert is bound by exactly one rank";
  for (size_t g = 0; g < tp_group_sum.size() && tp > 1; ++g)
    EXPECT_EQ(tp_group_sum[g], tp_full) << "TP group " << g << " binds each tensor-parallel byte once";

  // `kestrel plan --cell --ep P --tp T` predicts every rank's bytes exactly.
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg) << cfg.error().message();
  auto plan = plan::make_cell_plan(*cfg, dir, comm.size(), 1, 16, KvCacheDtype::kF32, tp);
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(static_cast<uint64_t>(plan->tp_full_bytes), tp > 1 ? tp_full : 0);
  for (int r = 0; r < comm.size(); ++r)
    EXPECT_EQ(bytes[static_cast<size_t>(r)], static_cast<uint64_t>(plan->ranks[static_cast<size_t>(r)].weight_bytes))
        << "rank " << r << " of " << comm.size() << ", TP " << tp;
}

void check_cell_traffic_matches_routing(dist::Communicator& comm, const std::string& dir, int tp) {
  dist::CountingCommunicator counting(comm);
  ExpertShard shard;
  auto model = load_shard(counting, dir, shard, tp);
  if (!all_ok(comm, model != nullptr)) return;
  const uint64_t before = counting.sent_bytes();
  Cell cell(*model, counting);
  run_workload(cell, model->config().text.vocab_size);
  const uint64_t measured = counting.sent_bytes() - before;
  const uint64_t computed = shard.traffic.total() + cell.traffic().plan_bytes + cell.traffic().logits_bytes;
  EXPECT_EQ(measured, computed) << "rank " << comm.rank();
  const int moe_layers = [&] {
    int n = 0;
    for (FfnKind k : model->config().text.ffn_kind) n += k == FfnKind::kMoe ? 1 : 0;
    return n;
  }();
  if (comm.size() > 1) {  // one dispatch / combine per MoE layer per step on every rank, idle or not
    EXPECT_EQ(shard.traffic.exchanges, static_cast<uint64_t>(moe_layers) * cell.traffic().steps) << "rank " << comm.rank();
    EXPECT_GT(shard.traffic.dispatch_bytes, 0u) << "rank " << comm.rank();
  }
  if (tp > 1) {  // every tensor-parallel MLP exchanges once per step on every rank, idle or not
    int tp_mlps = 0;
    for (FfnKind k : model->config().text.ffn_kind)
      tp_mlps += k == FfnKind::kDense || model->config().text.num_shared_experts > 0 ? 1 : 0;
    EXPECT_EQ(shard.traffic.tp_exchanges, static_cast<uint64_t>(tp_mlps) * cell.traffic().steps) << "rank " << comm.rank();
    EXPECT_GT(shard.traffic.tp_gather_bytes, 0u) << "rank " << comm.rank();
  } else {
    EXPECT_EQ(shard.traffic.tp_total(), 0u);
  }
}

}  // namespace kestrel::testing
