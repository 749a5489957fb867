#include "runtime/cell.h"

#include <algorithm>

namespace kestrel {

namespace {
// Plan wire format (int32): stop flag, run count, then per run: seq, rank, flags (1 reset, 2 all_logits, 4 pooled,
// 8 drop), token count, tokens, and for a pooled run the page table's length and block ids.
constexpr int32_t kReset = 1, kAllLogits = 2, kPooled = 4, kDrop = 8;

void encode(const std::vector<CellRun>& runs, bool stop, std::vector<int32_t>& out) {
  out.clear();
  out.push_back(stop ? 1 : 0);
  out.push_back(static_cast<int32_t>(runs.size()));
  for (const CellRun& r : runs) {
    out.push_back(r.seq);
    out.push_back(r.rank);
    out.push_back((r.reset ? kReset : 0) | (r.all_logits ? kAllLogits : 0) | (r.pooled ? kPooled : 0) |
                  (r.drop ? kDrop : 0));
    out.push_back(static_cast<int32_t>(r.ids.size()));
    out.insert(out.end(), r.ids.begin(), r.ids.end());
    if (!r.pooled) continue;
    out.push_back(static_cast<int32_t>(r.blocks.size()));
    out.insert(out.end(), r.blocks.begin(), r.blocks.end());
  }
}

Result<std::vector<CellRun>> decode(const std::vector<int32_t>& in, int nranks, bool& stop) {
  auto bad = [] { return corrupt("cell: malformed step plan"); };
  if (in.size() < 2) return bad();
  stop = in[0] != 0;
  std::vector<CellRun> runs(static_cast<size_t>(std::max(in[1], 0)));
  size_t at = 2;
  for (CellRun& r : runs) {
    if (at + 4 > in.size()) return bad();
    r.seq = in[at], r.rank = in[at + 1];
    r.reset = (in[at + 2] & kReset) != 0, r.all_logits = (in[at + 2] & kAllLogits) != 0;
    r.pooled = (in[at + 2] & kPooled) != 0, r.drop = (in[at + 2] & kDrop) != 0;
    const auto n = static_cast<size_t>(in[at + 3]);
    at += 4;
    if (r.rank < 0 || r.rank >= nranks || (n == 0) != r.drop || at + n > in.size()) return bad();
    r.ids.assign(in.begin() + static_cast<long>(at), in.begin() + static_cast<long>(at + n));
    at += n;
    if (!r.pooled) continue;
    if (at >= in.size()) return bad();
    const auto nb = static_cast<size_t>(in[at++]);
    if (at + nb > in.size()) return bad();
    r.blocks.assign(in.begin() + static_cast<long>(at), in.begin() + static_cast<long>(at + nb));
    at += nb;
  }
  if (at != in.size()) return bad();
  return runs;
}

int64_t rows_of(const CellRun& r) { return r.drop ? 0 : r.all_logits ? static_cast<int64_t>(r.ids.size()) : 1; }
}  // namespace

Cell::Cell(Model& model, dist::Communicator& comm, ForwardOptions options, KvCacheDtype kv)
    : model_(model), comm_(comm), options_(options), kv_(kv) {}

Status Cell::exchange_plan(std::vector<int32_t>& plan) {
  int64_t n = static_cast<int64_t>(plan.size());
  KESTREL_RETURN_IF_ERROR(comm_.broadcast(std::span<int64_t>(&n, 1), 0));
  plan.resize(static_cast<size_t>(n));
  KESTREL_RETURN_IF_ERROR(comm_.broadcast(std::span<int32_t>(plan), 0));
  if (rank() == 0)
    traffic_.plan_bytes += static_cast<uint64_t>(size() - 1) * (sizeof(int64_t) + plan.size() * sizeof(int32_t));
  return Status::ok();
}

Status Cell::step(const std::vector<CellRun>& runs, std::vector<float>& logits) {
  if (rank() != 0) return invalid_argument("cell: only rank 0 plans steps");
  // Checked here, before the broadcast, so that no rank ever receives a step it would refuse alone.
  const int64_t V = model_.config().text.vocab_size;
  for (const CellRun& r : runs) {
    if (r.pooled || r.drop) return invalid_argument("cell: step() runs standalone sequences; pooled ones go through step_held");
    if (r.rank < 0 || r.rank >= size() || r.ids.empty())
      return invalid_argument("cell: run of sequence " + std::to_string(r.seq) + " has rank " +
                              std::to_string(r.rank) + " and " + std::to_string(r.ids.size()) + " tokens");
    for (int32_t id : r.ids)
      if (id < 0 || id >= V)
        return invalid_argument("cell: token id " + std::to_string(id) + " outside the vocabulary (0.." +
                                std::to_string(V - 1) + ")");
  }
  encode(runs, false, plan_);
  KESTREL_RETURN_IF_ERROR(exchange_plan(plan_));
  return run(runs, &logits);
}

Status Cell::step_held(std::span<const SeqRun> local, const std::vector<CellRun>& remote, std::vector<float>& logits) {
  if (rank() != 0) return invalid_argument("cell: only rank 0 plans steps");
  for (const CellRun& r : remote)
    if (r.rank <= 0 || r.rank >= size() || !(r.pooled || r.drop) || r.all_logits || r.ids.empty() != r.drop)
      return invalid_argument("cell: remote run of sequence " + std::to_string(r.seq) + " on rank " +
                              std::to_string(r.rank) + " is not a pooled run or drop of another rank");
  encode(remote, false, plan_);
  KESTREL_RETURN_IF_ERROR(exchange_plan(plan_));
  model_.forward_batch(local, logits, options_);
  local_.clear();
  KESTREL_RETURN_IF_ERROR(collect(remote, &remote_));
  logits.insert(logits.end(), remote_.begin(), remote_.end());
  return Status::ok();
}

Status Cell::finish() {
  if (rank() != 0) return Status::ok();
  encode({}, true, plan_);
  return exchange_plan(plan_);
}

Status Cell::follow() {
  if (rank() == 0) return invalid_argument("cell: rank 0 plans, it does not follow");
  for (;;) {
    KESTREL_RETURN_IF_ERROR(exchange_plan(plan_));
    bool stop = false;
    auto runs = decode(plan_, size(), stop);
    if (!runs) return runs.error();
    if (stop) return Status::ok();
    KESTREL_RETURN_IF_ERROR(run(*runs, nullptr));
  }
}

Status Cell::run(const std::vector<CellRun>& runs, std::vector<float>* logits) {
  const int me = rank();
  mine_.clear();
  for (const CellRun& r : runs)  // drops first: a slot or block freed here may be taken again in this plan
    if (r.rank == me && r.drop) KESTREL_RETURN_IF_ERROR(place(r));
  for (const CellRun& r : runs) {
    if (r.rank != me || r.drop) continue;
    if (r.pooled) {
      KESTREL_RETURN_IF_ERROR(place(r));
      continue;
    }
    if (r.reset) seqs_.erase(r.seq);
    auto it = seqs_.find(r.seq);
    if (it == seqs_.end()) it = seqs_.emplace(r.seq, model_.new_sequence(kv_)).first;
    mine_.push_back(SeqRun{r.ids.data(), static_cast<int64_t>(r.ids.size()), &it->second, r.all_logits});
  }
  // Every rank runs the step, with or without tokens: the MoE layers exchange tokens with all ranks.
  ForwardOptions o = options_;
  o.all_logits = false;
  model_.forward_batch(mine_, local_, o);
  return collect(runs, logits);
}

// The ledger on rank 0 and this rank's pools take and free the same slots and blocks in the same order, so any
// disagreement is a bug: it ends the cell instead of computing over another sequence's state.
Status Cell::place(const CellRun& r) {
  const std::string who = "cell: rank " + std::to_string(rank()) + ": pooled sequence " + std::to_string(r.seq);
  if (pools_ == nullptr) return invalid_argument(who + ": this rank holds no cache pools");
  if (r.drop) {
    auto it = pooled_.find(r.seq);
    if (it == pooled_.end()) return corrupt(who + " dropped but not held");
    pools_->release(it->second.st, r.seq, it->second.blocks);
    pooled_.erase(it);
    return Status::ok();
  }
  if (r.reset) {
    if (pooled_.count(r.seq) != 0) return corrupt(who + " started afresh while still held");
    Pooled& p = pooled_[r.seq];
    if (!pools_->take_slot(p.st, r.seq)) return corrupt(who + ": the slot is not free here");
    ++pooled_started_;
  }
  auto it = pooled_.find(r.seq);
  if (it == pooled_.end()) return corrupt(who + " is not held here");
  Pooled& p = it->second;
  const size_t had = p.blocks.size();
  if (r.blocks.size() < had || !std::equal(p.blocks.begin(), p.blocks.end(), r.blocks.begin()))
    return corrupt(who + ": its page table differs from this rank's");
  if (!pools_->take_blocks(p.st, p.blocks, std::span<const int32_t>(r.blocks).subspan(had)))
    return corrupt(who + ": a page of its table is not free here");
  mine_.push_back(SeqRun{r.ids.data(), static_cast<int64_t>(r.ids.size()), &p.st, false});
  return Status::ok();
}

Status Cell::collect(const std::vector<CellRun>& runs, std::vector<float>* logits) {
  const int me = rank(), P = size();
  const int64_t V = model_.config().text.vocab_size;
  // Logits rows to rank 0: rank p's rows are its runs' rows in plan order.
  std::vector<size_t> send_counts(static_cast<size_t>(P), 0), send_displs(static_cast<size_t>(P), 0);
  std::vector<size_t> recv_counts(static_cast<size_t>(P), 0), recv_displs(static_cast<size_t>(P), 0);
  send_counts[0] = local_.size();
  size_t total = 0;
  if (me == 0) {
    for (const CellRun& r : runs) recv_counts[static_cast<size_t>(r.rank)] += static_cast<size_t>(rows_of(r) * V);
    for (int p = 0; p < P; ++p) recv_displs[static_cast<size_t>(p)] = total, total += recv_counts[static_cast<size_t>(p)];
  }
  gathered_.resize(total);
  KESTREL_RETURN_IF_ERROR(comm_.all_to_all_v<float>(local_, send_counts, send_displs, gathered_, recv_counts,
                                                    recv_displs));
  if (me != 0) traffic_.logits_bytes += local_.size() * sizeof(float);
  ++traffic_.steps;
  if (logits == nullptr) return Status::ok();
  logits->resize(total);
  std::vector<size_t> cursor(recv_displs);
  size_t out = 0;
  for (const CellRun& r : runs) {
    const size_t n = static_cast<size_t>(rows_of(r) * V);
    size_t& c = cursor[static_cast<size_t>(r.rank)];
    std::copy_n(gathered_.begin() + static_cast<long>(c), n, logits->begin() + static_cast<long>(out));
    c += n, out += n;
  }
  return Status::ok();
}

}  // namespace kestrel
