// Cell: one model run by several ranks (processes) in lockstep (docs/cell.md). Rank 0 owns the requests and
// plans every step: which sequence runs which tokens on which rank. The plan is broadcast; every rank runs
// forward_batch over the sequences it holds (possibly none: an empty batch still takes part in every MoE
// layer's dispatch / combine); the logits rows come back to rank 0 in plan order. A sequence's MLA pages and
// KDA state live on exactly one rank (data-parallel attention); routed experts are split across the ranks by
// the model's ExpertShard (layers/expert_shard.h).
//
// Failure: a collective that fails returns its Status; the caller must then end the process (non-zero exit)
// so that mpirun ends the whole cell (dist/mpi_communicator.h).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "dist/communicator.h"
#include "models/model.h"

namespace kestrel {

struct CellRun {
  int32_t seq = 0;          // sequence id (rank 0's numbering)
  int32_t rank = 0;         // rank that holds the sequence's pages and KDA state
  bool reset = false;       // start the sequence afresh (state under this id dropped first)
  bool all_logits = false;  // logits for every token of this run (else its last)
  std::vector<int32_t> ids;
};

// Bytes the cell's own messages moved to other ranks (the MoE traffic is in ExpertShard::traffic).
struct CellTraffic {
  uint64_t plan_bytes = 0;    // broadcasts from rank 0 (counted once per receiving rank)
  uint64_t logits_bytes = 0;  // logits rows sent to rank 0 by the other ranks
  uint64_t steps = 0;
};

class Cell {
 public:
  // Every rank builds its Cell over its own model (loaded with its ExpertShard) and the cell's communicator.
  Cell(Model& model, dist::Communicator& comm, ForwardOptions options = {}, KvCacheDtype kv = KvCacheDtype::kF32);
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // Rank 0: runs one step of `runs` on every rank; `logits` receives each run's rows in run order
  // ([rows, vocab]). The other ranks must be in follow().
  Status step(const std::vector<CellRun>& runs, std::vector<float>& logits);
  // Rank 0: runs one step over sequences rank 0 holds itself (a server's pool-backed sequences; `logits` as
  // forward_batch gives them). The other ranks, in follow(), run an empty batch: they hold no attention state
  // for this step, only their experts. Same bits as forward_batch in one process.
  Status step_held(std::span<const SeqRun> runs, std::vector<float>& logits);
  // Rank 0: ends follow() on the other ranks. The sequences stay: once the others call follow() again, rank 0
  // may step on (a phase boundary, e.g. between a bench's prefill and decode).
  Status finish();
  // Ranks other than 0: runs rank 0's steps until finish().
  Status follow();

  const CellTraffic& traffic() const { return traffic_; }
  // Sequences this rank holds now, and their cached tokens.
  size_t held_sequences() const { return seqs_.size(); }
  int64_t held_tokens() const {
    int64_t n = 0;
    for (const auto& [id, s] : seqs_) n += s.n_tokens;
    return n;
  }

 private:
  Status exchange_plan(std::vector<int32_t>& plan);  // rank 0 sends, others receive
  Status run(const std::vector<CellRun>& runs, std::vector<float>* logits);  // every rank
  // Every rank, after its forward over local_: the runs' logits rows to rank 0, in run order.
  Status collect(const std::vector<CellRun>& runs, std::vector<float>* logits);

  Model& model_;
  dist::Communicator& comm_;
  ForwardOptions options_;
  KvCacheDtype kv_;
  std::map<int32_t, SequenceState> seqs_;
  CellTraffic traffic_;
  // Scratch.
  std::vector<int32_t> plan_;
  std::vector<SeqRun> mine_;
  std::vector<float> local_, gathered_;
};

}  // namespace kestrel
