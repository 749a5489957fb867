// Cell: one model run by several ranks (processes) in lockstep (docs/cell.md). Rank 0 owns the requests and
// plans every step: which sequence runs which tokens on which rank. The plan is broadcast; every rank runs
// forward_batch over the sequences it holds (possibly none: an empty batch still takes part in every MoE
// layer's dispatch / combine); the logits rows come back to rank 0 in plan order. A sequence's MLA pages and
// KDA state live on exactly one rank (data-parallel attention); routed experts are split across the ranks by
// the model's ExpertShard (layers/expert_shard.h).
//
// A serving cell (scheduler/scheduler.h) places sequences in cache pools: rank 0's scheduler keeps the ledger of
// every rank's pools and each pooled run names the slot and the page table; the rank that holds the sequence
// takes exactly those in its own pools (hold_in) and frees them when rank 0 sends a drop.
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
  int32_t seq = 0;          // sequence id (rank 0's numbering); a pooled sequence's id is its KDA slot
  int32_t rank = 0;         // rank that holds the sequence's pages and KDA state
  bool reset = false;       // start the sequence afresh (state under this id dropped first; pooled: slot taken)
  bool all_logits = false;  // logits for every token of this run (else its last)
  std::vector<int32_t> ids;
  bool pooled = false;            // the sequence lives in the rank's cache pools (slot `seq`, page table `blocks`)
  bool drop = false;              // no tokens: the rank frees pooled sequence `seq` (its slot and pages)
  std::vector<int32_t> blocks = {};  // pooled: the whole page table (it only grows)
};

// Where a rank of a serving cell keeps its pooled sequences: its cache pools (cache/cache_pools.h implements
// this). The calls take exactly the slot and blocks rank 0's ledger chose; false when one is not free here.
class CellPools {
 public:
  virtual ~CellPools() = default;
  virtual bool take_slot(SequenceState& s, int slot) = 0;
  virtual bool take_blocks(SequenceState& s, std::vector<int32_t>& blocks, std::span<const int32_t> more) = 0;
  virtual void release(SequenceState& s, int slot, std::vector<int32_t>& blocks) = 0;
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
  // Rank 0 of a serving cell: runs one step over `local`, sequences rank 0 holds itself (its scheduler's
  // pool-backed sequences), and `remote`, pooled runs and drops for the other ranks (in follow(), holding their
  // pools via hold_in; a rank with no run takes part with an empty batch). `logits`: the last row of each local
  // run in order (as forward_batch gives them), then that of each remote run that is not a drop. Same bits as
  // forward_batch in one process.
  Status step_held(std::span<const SeqRun> local, const std::vector<CellRun>& remote, std::vector<float>& logits);
  // Ranks other than 0 of a serving cell: pooled runs live in `pools` (configured as rank 0's ledger for this
  // rank). Without it a pooled run is refused.
  void hold_in(CellPools& pools) { pools_ = &pools; }
  // Rank 0: ends follow() on the other ranks. The sequences stay: once the others call follow() again, rank 0
  // may step on (a phase boundary, e.g. between a bench's prefill and decode).
  Status finish();
  // Ranks other than 0: runs rank 0's steps until finish().
  Status follow();

  const CellTraffic& traffic() const { return traffic_; }
  // Sequences this rank holds now, and their cached tokens.
  size_t held_sequences() const { return seqs_.size() + pooled_.size(); }
  int64_t held_tokens() const {
    int64_t n = 0;
    for (const auto& [id, s] : seqs_) n += s.n_tokens;
    for (const auto& [id, p] : pooled_) n += p.st.n_tokens;
    return n;
  }
  // Sequences this rank has held in its pools so far (pooled runs that started afresh).
  int64_t pooled_started() const { return pooled_started_; }

 private:
  Status exchange_plan(std::vector<int32_t>& plan);  // rank 0 sends, others receive
  Status run(const std::vector<CellRun>& runs, std::vector<float>* logits);  // every rank
  Status place(const CellRun& r);  // a pooled run's or drop's effect on this rank's pools; adds to mine_
  // Every rank, after its forward over local_: the runs' logits rows to rank 0, in run order.
  Status collect(const std::vector<CellRun>& runs, std::vector<float>* logits);

  Model& model_;
  dist::Communicator& comm_;
  ForwardOptions options_;
  KvCacheDtype kv_;
  std::map<int32_t, SequenceState> seqs_;
  struct Pooled {
    SequenceState st;
    std::vector<int32_t> blocks;
  };
  CellPools* pools_ = nullptr;
  std::map<int32_t, Pooled> pooled_;  // by slot
  int64_t pooled_started_ = 0;
  CellTraffic traffic_;
  // Scratch.
  std::vector<int32_t> plan_;
  std::vector<SeqRun> mine_;
  std::vector<float> local_, gathered_, remote_;
};

}  // namespace kestrel
