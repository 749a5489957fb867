#include "layers/ffn.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "dist/tp_partition.h"
#include "kernels/cpu/elementwise.h"
#include "layers/moe_combine.h"
#include "layers/shared_temps.h"

namespace kestrel {

using kernels::matmul;
using kernels::MatmulTask;

namespace {
// One member's partial output rows added to the sum; the tensor-parallel MLP adds the members' partials
// through it in group order, so the sum is the same operations on every run and every batch.
[[gnu::noinline]] void add_partial(float* dst, const float* src, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] += src[d];
}

// A collective inside a step failed: the peers are blocked in the same step and the cell cannot go on.
[[noreturn]] void cell_failure(const ExpertShard& s, const Status& st, const char* what = "MoE dispatch/combine") {
  std::fprintf(stderr, "kestrel: rank %d of %d: %s failed, ending the cell: %s\n", s.rank, s.size, what,
               st.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
}  // namespace

void GatedMlp::bind(Binder& b, const std::string& p, const char* gate, const char* up, const char* down,
                    int64_t in, int64_t inter, const TextConfig& c) {
  c_ = &c;
  wg_ = b.linear(p + gate, inter, in);
  wu_ = b.linear(p + up, inter, in);
  wd_ = b.linear(p + down, in, inter);
}

void GatedMlp::bind_dense(Binder& b, const std::string& p, const char* gate, const char* up, const char* down,
                          int64_t in, int64_t inter, const TextConfig& c) {
  ExpertShard* sh = b.expert_shard();
  if (sh == nullptr || sh->tp <= 1) return bind(b, p, gate, up, down, in, inter, c);
  c_ = &c;
  tp_ = sh;
  // One cut for all three matrices: the coarsest block among them (gate / up rows and down columns are the
  // same intermediate index).
  int64_t block = 1;
  for (const char* n : {gate, up, down}) block = std::max(block, b.tp_block(p + n));
  if (!b.ok()) return;
  const auto [i0, i1] = dist::tp_slice(inter, block, sh->tp, sh->rank % sh->tp);
  wg_ = b.linear_rows(p + gate, inter, in, i0, i1);
  wu_ = b.linear_rows(p + up, inter, in, i0, i1);
  wd_ = b.linear_cols(p + down, in, inter, i0, i1, down_store_);
}

void GatedMlp::gate_up_tasks(const float* x, int64_t T, float* g, float* u, std::vector<MatmulTask>& out) const {
  out.push_back({&wg_, x, T, g});
  out.push_back({&wu_, x, T, u});
}

void GatedMlp::activate(float* g, const float* u, int64_t n) const {
  if (c_->hidden_act == Activation::kSiTU)
    kernels::situ_glu(g, u, n, c_->situ_beta, c_->situ_linear_beta, g);
  else if (c_->hidden_act == Activation::kSwiGluOai)
    kernels::swiglu_oai(g, u, n, c_->swiglu_alpha, c_->swiglu_limit, g);
  else
    kernels::swiglu(g, u, n, g);
}

void GatedMlp::add_gate_up_bias(float* g, float* u, int64_t rows, int64_t ld, int64_t c0, int64_t c1) const {
  if (bg_ == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) g[r * ld + c] += bg_[c], u[r * ld + c] += bu_[c];
}

void GatedMlp::add_down_bias(float* y, int64_t rows, int64_t ld, int64_t d0, int64_t d1) const {
  if (bd_ == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = d0; d < d1; ++d) y[r * ld + d] += bd_[d];
}

void GatedMlp::forward(const float* x, int64_t T, float* y) {
  if (tp_ != nullptr) return forward_tp(x, T, y);
  Temps& ts = shared_temps<Temps>();
  const int64_t n = T * wg_.out;
  ts.g.resize(static_cast<size_t>(n));
  ts.u.resize(static_cast<size_t>(n));
  tasks_.clear();
  gate_up_tasks(x, T, ts.g.data(), ts.u.data(), tasks_);
  kernels::matmul_many(tasks_);
  activate(ts.g.data(), ts.u.data(), n);
  matmul(wd_, ts.g.data(), T, y);
}

// Three all_to_all_v inside the TP group (ranks outside it get nothing): each member's row count; its hidden
// rows to every member (the gathered batch, members in order); and member j's partial output rows for member
// m's tokens back to m. Each rank then sums the partials of members 0, 1, …, T−1 left to right. The slice
// kernels are row-invariant, so a token's result does not depend on the other tokens of the group.
void GatedMlp::forward_tp(const float* x, int64_t T, float* y) {
  Temps& ts = shared_temps<Temps>();
  ExpertShard& sh = *tp_;
  dist::Communicator& comm = *sh.comm;
  const int P = sh.size, me = sh.rank, G = sh.tp, g0 = dist::tp_group_first(me, G);
  const int64_t hid = wd_.out, inter = wg_.out;
  const auto Pn = static_cast<size_t>(P);
  for (auto& v : tp_counts_) v.assign(Pn, 0);
  auto& rows = tp_counts_[0];  // rows of each member, indexed by rank
  auto& sc = tp_counts_[1];
  auto& sd = tp_counts_[2];
  auto& rc = tp_counts_[3];
  auto& rd = tp_counts_[4];
  auto& mine = tp_counts_[5];  // this rank's row count, once per member
  auto& got = tp_counts_[6];   // each member's row count
  mine.assign(static_cast<size_t>(G), static_cast<size_t>(T));
  got.assign(static_cast<size_t>(G), 0);
  for (int m = 0; m < G; ++m) {
    const auto p = static_cast<size_t>(g0 + m);
    sc[p] = rc[p] = 1;
    sd[p] = rd[p] = static_cast<size_t>(m);
  }
  Status st = comm.all_to_all_v<size_t>(mine, sc, sd, got, rc, rd);
  if (!st.is_ok()) cell_failure(sh, st, "tensor-parallel MLP");
  size_t N = 0;
  for (int m = 0; m < G; ++m) {
    const auto p = static_cast<size_t>(g0 + m);
    rows[p] = got[static_cast<size_t>(m)];
    sc[p] = static_cast<size_t>(T * hid), sd[p] = 0;
    rc[p] = rows[p] * static_cast<size_t>(hid), rd[p] = N * static_cast<size_t>(hid);
    N += rows[p];
  }
  ts.tp_x.resize(N * static_cast<size_t>(hid));
  st = comm.all_to_all_v<float>(std::span<const float>(x, static_cast<size_t>(T * hid)), sc, sd, ts.tp_x, rc, rd);
  if (!st.is_ok()) cell_failure(sh, st, "tensor-parallel MLP");

  const auto n = static_cast<int64_t>(N);
  ts.tp_part.assign(N * static_cast<size_t>(hid), 0.0f);  // a member without columns contributes zeros
  if (n > 0 && inter > 0) {
    ts.g.resize(static_cast<size_t>(n * inter));
    ts.u.resize(static_cast<size_t>(n * inter));
    tasks_.clear();
    gate_up_tasks(ts.tp_x.data(), n, ts.g.data(), ts.u.data(), tasks_);
    kernels::matmul_many(tasks_);
    activate(ts.g.data(), ts.u.data(), n * inter);
    matmul(wd_, ts.g.data(), n, ts.tp_part.data());
  }
  for (int m = 0; m < G; ++m) {
    const auto p = static_cast<size_t>(g0 + m);
    sc[p] = rc[p], sd[p] = rd[p];  // member m's rows of this partial go back to m
    rc[p] = static_cast<size_t>(T * hid), rd[p] = static_cast<size_t>(m * T * hid);
  }
  ts.tp_recv.resize(static_cast<size_t>(G * T * hid));
  st = comm.all_to_all_v<float>(ts.tp_part, sc, sd, ts.tp_recv, rc, rd);
  if (!st.is_ok()) cell_failure(sh, st, "tensor-parallel MLP");
  for (int m = 0; m < G; ++m) {
    if (g0 + m == me) continue;
    sh.traffic.tp_count_bytes += sizeof(size_t);
    sh.traffic.tp_gather_bytes += static_cast<uint64_t>(T * hid) * sizeof(float);
    sh.traffic.tp_partial_bytes += sc[static_cast<size_t>(g0 + m)] * sizeof(float);
  }
  ++sh.traffic.tp_exchanges;

  // The members' partials in group order: ((p_0 + p_1) + p_2) + …
  if (T == 0) return;
  std::copy_n(ts.tp_recv.data(), T * hid, y);
  for (int m = 1; m < G; ++m) add_partial(y, ts.tp_recv.data() + m * T * hid, T * hid);
}

Status MoeBlock::bind(Binder& b, const std::string& p, const TextConfig& c, const ExpertNames& names) {
  c_ = &c;
  E_ = c.num_experts;
  K_ = c.num_experts_per_token;
  const int64_t hid = c.hidden_size;
  router_ = b.linear(p + "gate", E_, hid);
  if (c.router_bias) bias_ = b.vec(p + "gate.e_score_correction_bias", {E_});
  if (c.router_logit_bias) logit_bias_ = b.vec(p + "gate.bias", {E_});
  in_ = c.latent_moe() ? c.routed_expert_hidden_size : hid;
  if (c.latent_moe()) {
    lat_down_ = b.linear(p + "routed_expert_down_proj", in_, hid);
    lat_up_ = b.linear(p + "routed_expert_up_proj", hid, in_);
    if (c.latent_moe_use_norm) lat_norm_ = b.vec(p + "routed_expert_norm.weight", {in_});
  }
  shard_ = b.expert_shard();
  if (sharded() && c.expert_bias)
    return unsupported("expert parallelism does not run experts with biases (gpt-oss) yet");
  if (sharded() && K_ > kMaxEpTopK)
    return unsupported("expert parallelism supports up to " + std::to_string(kMaxEpTopK) + " experts per token, not " +
                       std::to_string(K_));
  experts_.resize(static_cast<size_t>(E_));
  for (int64_t e = 0; e < E_ && b.ok(); ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    if (sharded() && !shard_->owns(e, E_)) {  // another rank's expert: accounted for, not read
      for (const char* n : {names.gate, names.up, names.down}) b.skip_linear(ep + n);
      continue;
    }
    experts_[static_cast<size_t>(e)].bind(b, ep, names.gate, names.up, names.down, in_, c.moe_intermediate_size, c);
  }
  if (sharded()) ep_by_expert_.resize(static_cast<size_t>(E_));
  if (c.expert_bias) {
    const int64_t inter = c.moe_intermediate_size;
    gate_bias_ = b.vec(p + "experts.gate_proj_bias", {E_, inter});
    up_bias_ = b.vec(p + "experts.up_proj_bias", {E_, inter});
    down_bias_ = b.vec(p + "experts.down_proj_bias", {E_, in_});
    for (int64_t e = 0; e < E_ && b.ok(); ++e)
      experts_[static_cast<size_t>(e)].set_biases(gate_bias_.data() + e * inter, up_bias_.data() + e * inter,
                                                  down_bias_.data() + e * in_);
  }
  has_shared_ = c.num_shared_experts > 0;
  if (has_shared_)
    shared_.bind_dense(b, p + "shared_experts.", "gate_proj", "up_proj", "down_proj", hid,
                 static_cast<int64_t>(c.num_shared_experts) * c.moe_intermediate_size, c);
  by_expert_.resize(static_cast<size_t>(E_));
  for (auto& v : by_expert_) v.reserve(64);  // decode never grows these
  bind_fused();
  return b.status();
}

void MoeBlock::route(const float* x, int64_t T, std::vector<int>& ids, std::vector<float>& weights) {
  Temps& ts = shared_temps<Temps>();
  ts.logits.resize(static_cast<size_t>(T * E_));
  matmul(router_, x, T, ts.logits.data());
  add_router_bias(T);
  select(T, ids, weights);
}

void MoeBlock::add_router_bias(int64_t T) {
  if (logit_bias_.empty()) return;
  float* l = shared_temps<Temps>().logits.data();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E_; ++e) l[t * E_ + e] += logit_bias_[static_cast<size_t>(e)];
}

// The biases of the grouped path's rows (by_expert_ order: each active expert's tokens in turn).
void MoeBlock::add_gate_up_biases() {
  Temps& ts = shared_temps<Temps>();
  const int64_t inter = c_->moe_intermediate_size;
  int64_t off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto n = static_cast<int64_t>(by_expert_[static_cast<size_t>(e)].size());
    if (n == 0) continue;
    experts_[static_cast<size_t>(e)].add_gate_up_bias(ts.g.data() + off * inter, ts.u.data() + off * inter, n, inter, 0, inter);
    off += n;
  }
}

void MoeBlock::add_down_biases() {
  Temps& ts = shared_temps<Temps>();
  int64_t off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto n = static_cast<int64_t>(by_expert_[static_cast<size_t>(e)].size());
    if (n == 0) continue;
    experts_[static_cast<size_t>(e)].add_down_bias(ts.eout.data() + off * in_, n, in_, 0, in_);
    off += n;
  }
}

void MoeBlock::select(int64_t T, std::vector<int>& ids, std::vector<float>& weights) {
  Temps& ts = shared_temps<Temps>();
  ids.resize(static_cast<size_t>(T * K_));
  weights.resize(static_cast<size_t>(T * K_));
  std::vector<int>& order = ids_;
  order.resize(static_cast<size_t>(E_));
  std::vector<float>& sel = sel_;
  sel.resize(static_cast<size_t>(E_));
  score_.resize(static_cast<size_t>(E_));
  const int64_t G = c_->num_expert_group, per_group = E_ / G;
  group_score_.resize(static_cast<size_t>(G));
  group_order_.resize(static_cast<size_t>(G));
  const bool has_bias = !bias_.empty();
  auto by_value = [](const std::vector<float>& v) {
    return [&v](int a, int b) {
      const float sa = v[static_cast<size_t>(a)], sb = v[static_cast<size_t>(b)];
      return sa > sb || (sa == sb && a < b);
    };
  };
  for (int64_t t = 0; t < T; ++t) {
    const float* l = ts.logits.data() + t * E_;
    if (c_->router_scoring == RouterScoring::kSoftmax) {
      const float mx = *std::max_element(l, l + E_);
      float sum = 0;
      for (int64_t e = 0; e < E_; ++e) sum += score_[static_cast<size_t>(e)] = std::exp(l[e] - mx);
      for (int64_t e = 0; e < E_; ++e) score_[static_cast<size_t>(e)] /= sum;
    } else {
      for (int64_t e = 0; e < E_; ++e) score_[static_cast<size_t>(e)] = kernels::sigmoid(l[e]);
    }
    for (int64_t e = 0; e < E_; ++e)
      sel[static_cast<size_t>(e)] = score_[static_cast<size_t>(e)] + (has_bias ? bias_[static_cast<size_t>(e)] : 0.0f);
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        const float* s = sel.data() + g * per_group;
        float a = -INFINITY, b = -INFINITY;  // largest two
        for (int64_t i = 0; i < per_group; ++i) {
          if (s[i] > a) b = a, a = s[i];
          else if (s[i] > b) b = s[i];
        }
        group_score_[static_cast<size_t>(g)] = has_bias ? a + b : a;
      }
      std::iota(group_order_.begin(), group_order_.end(), 0);
      std::partial_sort(group_order_.begin(), group_order_.begin() + c_->topk_group, group_order_.end(),
                        by_value(group_score_));
      for (int64_t i = c_->topk_group; i < G; ++i)
        std::fill_n(sel.begin() + group_order_[static_cast<size_t>(i)] * per_group, per_group, -INFINITY);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K_, order.end(), by_value(sel));
    float sum = 0;
    for (int64_t i = 0; i < K_; ++i) {
      const int e = order[static_cast<size_t>(i)];
      ids[static_cast<size_t>(t * K_ + i)] = e;
      const float s = score_[static_cast<size_t>(e)];
      weights[static_cast<size_t>(t * K_ + i)] = s;
      sum += s;
    }
    for (int64_t i = 0; i < K_; ++i) {
      float& w = weights[static_cast<size_t>(t * K_ + i)];
      if (c_->moe_renormalize) w /= (sum + 1e-20f);
      w *= c_->routed_scaling_factor;
    }
  }
}

// Router (+ latent down) in one region, then the experts: on GGUF int8 weights in one more region
// (forward_fused, moe_fused.cpp), otherwise grouped through matmul_many (forward_grouped), then latent up.
// In a cell the routed experts run in routed_ep() and the shared experts in their own two regions.
void MoeBlock::forward(const float* x, int64_t T, float* out) {
  Temps& ts = shared_temps<Temps>();
  const int64_t hid = c_->hidden_size, inter = c_->moe_intermediate_size;
  ts.logits.resize(static_cast<size_t>(T * E_));
  const float* in = x;
  tasks_.clear();
  tasks_.push_back({&router_, x, T, ts.logits.data()});
  if (c_->latent_moe()) {
    ts.z.resize(static_cast<size_t>(T * in_));
    tasks_.push_back({&lat_down_, x, T, ts.z.data()});
    in = ts.z.data();
  }
  if (T > 0) kernels::matmul_many(tasks_);
  add_router_bias(T);
  std::vector<int>& ids = route_ids_;
  select(T, ids, w_);

  const int64_t sh_inter = has_shared_ ? static_cast<int64_t>(c_->num_shared_experts) * inter : 0;
  if (has_shared_) {
    ts.sg.resize(static_cast<size_t>(T * sh_inter));
    ts.su.resize(static_cast<size_t>(T * sh_inter));
    ts.shared_out.resize(static_cast<size_t>(T * hid));
  }
  if (sharded()) {
    routed_ep(in, T);
    if (has_shared_ && shared_.tensor_parallel()) {
      shared_.forward(x, T, ts.shared_out.data());  // every rank, T = 0 included: the group exchanges rows
    } else if (has_shared_ && T > 0) {
      tasks_.clear();
      down_.clear();
      shared_.gate_up_tasks(x, T, ts.sg.data(), ts.su.data(), tasks_);
      down_.push_back(shared_.down_task(ts.sg.data(), T, ts.shared_out.data()));
      kernels::matmul_many(tasks_);
      shared_.activate(ts.sg.data(), ts.su.data(), T * sh_inter);
      kernels::matmul_many(down_);
    }
  } else {
    // Tokens of each expert, experts in ascending order; rows of expert e live at [off_e, off_e + n_e).
    for (auto& v : by_expert_) v.clear();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < K_; ++i)
        by_expert_[static_cast<size_t>(ids[static_cast<size_t>(t * K_ + i)])].push_back(
            {t, w_[static_cast<size_t>(t * K_ + i)]});
    if (fused_applies(T)) {
      forward_fused(x, in, T);
    } else {
      forward_grouped(x, in, T);
    }
  }
  if (T == 0) return;
  if (c_->latent_moe()) {
    if (c_->latent_moe_use_norm)
      kernels::rms_norm(ts.acc.data(), lat_norm_.data(), T, in_, c_->rms_norm_eps, ts.acc.data());
    matmul(lat_up_, ts.acc.data(), T, out);
  } else {
    std::copy(ts.acc.begin(), ts.acc.end(), out);
  }
  if (has_shared_)
    for (int64_t i = 0; i < T * hid; ++i) out[i] += ts.shared_out[static_cast<size_t>(i)];
}

// The experts through matmul_many: (gate/up of every routed expert over its gathered tokens + the shared
// experts'), the activation, (every down projection), then the weighted combine. Each expert's weights are
// read once per call.
void MoeBlock::forward_grouped(const float* x, const float* in, int64_t T) {
  Temps& ts = shared_temps<Temps>();
  const int64_t inter = c_->moe_intermediate_size, sh_inter = has_shared_ ? static_cast<int64_t>(c_->num_shared_experts) * inter : 0;
  const int64_t rows = T * K_;
  ts.gathered.resize(static_cast<size_t>(rows * in_));
  ts.g.resize(static_cast<size_t>(rows * inter));
  ts.u.resize(static_cast<size_t>(rows * inter));
  ts.eout.resize(static_cast<size_t>(rows * in_));
  tasks_.clear();
  down_.clear();
  int64_t off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& toks = by_expert_[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(in + toks[static_cast<size_t>(i)].first * in_, in_, ts.gathered.data() + (off + i) * in_);
    const GatedMlp& ex = experts_[static_cast<size_t>(e)];
    ex.gate_up_tasks(ts.gathered.data() + off * in_, n, ts.g.data() + off * inter, ts.u.data() + off * inter, tasks_);
    down_.push_back(ex.down_task(ts.g.data() + off * inter, n, ts.eout.data() + off * in_));
    off += n;
  }
  if (has_shared_) {
    shared_.gate_up_tasks(x, T, ts.sg.data(), ts.su.data(), tasks_);
    down_.push_back(shared_.down_task(ts.sg.data(), T, ts.shared_out.data()));
  }
  kernels::matmul_many(tasks_);
  if (c_->expert_bias) add_gate_up_biases();
  if (off > 0) experts_[0].activate(ts.g.data(), ts.u.data(), off * inter);
  if (has_shared_) shared_.activate(ts.sg.data(), ts.su.data(), T * sh_inter);
  kernels::matmul_many(down_);
  if (c_->expert_bias) add_down_biases();

  // Weighted sum per token, experts in ascending order (the order does not depend on the batch).
  ts.acc.assign(static_cast<size_t>(T * in_), 0.0f);
  off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& toks = by_expert_[static_cast<size_t>(e)];
    for (size_t i = 0; i < toks.size(); ++i, ++off) {
      const auto [t, w] = toks[i];
      add_weighted(ts.acc.data() + t * in_, ts.eout.data() + off * in_, w, in_);
    }
  }
}

// Dispatch / expert compute / combine across the cell (docs/cell.md). Three all_to_all_v per call:
//   1. record counts: how many token records this rank sends to each rank;
//   2. dispatch: one record per (token, destination rank) — K int32 expert ids (−1 where the slot's expert
//      lives elsewhere) followed by the token's routed-expert input row (in_ floats) — tokens ascending;
//   3. combine: one output row per valid slot of every received record, in record order then slot order,
//      sent back to the token's rank, where Temps::acc sums them per token in ascending expert id.
// Owned experts run in ascending id over the rows that reached them, as in one process; the expert kernels
// are row-invariant, so each output row has the bits it would have in one process.
void MoeBlock::routed_ep(const float* in, int64_t T) {
  Temps& ts = shared_temps<Temps>();
  ExpertShard& sh = *shard_;
  dist::Communicator& comm = *sh.comm;
  const int P = sh.size, me = sh.rank;
  const int64_t inter = c_->moe_intermediate_size, rec = K_ + in_;
  const auto Pn = static_cast<size_t>(P);
  for (auto& v : ep_counts_) v.assign(Pn, 0);
  auto& n_send = ep_counts_[0];  // records to each rank
  auto& n_recv = ep_counts_[1];  // records from each rank
  auto& ret_rows_in = ep_counts_[2];   // output rows coming back from each rank
  auto& ret_rows_out = ep_counts_[3];  // output rows going back to each rank
  auto& cnt = ep_counts_[4];
  auto& dsp = ep_counts_[5];
  auto& cnt2 = ep_counts_[6];
  auto& dsp2 = ep_counts_[7];
  const std::vector<int>& ids = route_ids_;
  std::vector<int>& owner = ep_order_;
  owner.resize(static_cast<size_t>(T * K_));
  for (int64_t s = 0; s < T * K_; ++s) owner[static_cast<size_t>(s)] = sh.owner(ids[static_cast<size_t>(s)], E_);

  // Records, grouped by destination rank; ep_slot_row_[slot] = the slot's row within its rank's returned block.
  ts.ep_send.clear();
  ep_slot_row_.assign(static_cast<size_t>(T * K_), -1);
  for (int p = 0; p < P; ++p) {
    int64_t rows = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int* o = owner.data() + t * K_;
      if (std::find(o, o + K_, p) == o + K_) continue;
      for (int64_t i = 0; i < K_; ++i) {
        const int32_t e = o[i] == p ? ids[static_cast<size_t>(t * K_ + i)] : -1;
        float bits;
        std::memcpy(&bits, &e, sizeof bits);
        ts.ep_send.push_back(bits);
        if (o[i] == p) ep_slot_row_[static_cast<size_t>(t * K_ + i)] = rows++;
      }
      ts.ep_send.insert(ts.ep_send.end(), in + t * in_, in + (t + 1) * in_);
      ++n_send[static_cast<size_t>(p)];
    }
    ret_rows_in[static_cast<size_t>(p)] = static_cast<size_t>(rows);
  }
  auto fill = [&](const std::vector<size_t>& n, size_t unit, std::vector<size_t>& c, std::vector<size_t>& d) {
    size_t at = 0;
    for (size_t p = 0; p < Pn; ++p) c[p] = n[p] * unit, d[p] = at, at += c[p];
    return at;
  };
  std::iota(dsp.begin(), dsp.end(), size_t{0});
  std::fill(cnt.begin(), cnt.end(), size_t{1});
  Status st = comm.all_to_all_v<size_t>(n_send, cnt, dsp, n_recv, cnt, dsp);
  if (!st.is_ok()) cell_failure(sh, st);
  fill(n_send, static_cast<size_t>(rec), cnt, dsp);
  const size_t recv_floats = fill(n_recv, static_cast<size_t>(rec), cnt2, dsp2);
  ts.ep_recv.resize(recv_floats);
  st = comm.all_to_all_v<float>(ts.ep_send, cnt, dsp, ts.ep_recv, cnt2, dsp2);
  if (!st.is_ok()) cell_failure(sh, st);

  // Rows that arrived, by owned expert; return rows numbered in (source rank, record, slot) order.
  for (auto& v : ep_by_expert_) v.clear();
  const int64_t n_rec = static_cast<int64_t>(recv_floats) / rec;
  int64_t r = 0;
  size_t src = 0;
  for (int64_t j = 0; j < n_rec; ++j) {
    while (static_cast<size_t>(j) * static_cast<size_t>(rec) >= dsp2[src] + cnt2[src]) ++src;
    const float* head = ts.ep_recv.data() + j * rec;
    for (int64_t i = 0; i < K_; ++i) {
      int32_t e;
      std::memcpy(&e, head + i, sizeof e);
      if (e < 0) continue;
      if (e >= E_ || !sh.owns(e, E_))
        cell_failure(sh, corrupt("expert " + std::to_string(e) + " was dispatched to rank " + std::to_string(me) +
                                  ", which does not own it"));
      ep_by_expert_[static_cast<size_t>(e)].push_back({j, r++});
      ++ret_rows_out[src];
    }
  }
  ts.gathered.resize(static_cast<size_t>(r * in_));
  ts.g.resize(static_cast<size_t>(r * inter));
  ts.u.resize(static_cast<size_t>(r * inter));
  ts.eout.resize(static_cast<size_t>(r * in_));
  tasks_.clear();
  down_.clear();
  int64_t off = 0;
  for (int64_t e = sh.first(E_, me); e < sh.first(E_, me + 1); ++e) {
    const auto& rows = ep_by_expert_[static_cast<size_t>(e)];
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(ts.ep_recv.data() + rows[static_cast<size_t>(i)].first * rec + K_, in_,
                  ts.gathered.data() + (off + i) * in_);
    const GatedMlp& ex = experts_[static_cast<size_t>(e)];
    ex.gate_up_tasks(ts.gathered.data() + off * in_, n, ts.g.data() + off * inter, ts.u.data() + off * inter, tasks_);
    down_.push_back(ex.down_task(ts.g.data() + off * inter, n, ts.eout.data() + off * in_));
    off += n;
  }
  ts.ep_ret_send.resize(static_cast<size_t>(r * in_));
  if (off > 0) {
    kernels::matmul_many(tasks_);
    experts_[static_cast<size_t>(sh.first(E_, me))].activate(ts.g.data(), ts.u.data(), off * inter);
    kernels::matmul_many(down_);
    off = 0;
    for (int64_t e = sh.first(E_, me); e < sh.first(E_, me + 1); ++e)
      for (const auto& [j, row] : ep_by_expert_[static_cast<size_t>(e)])
        std::copy_n(ts.eout.data() + (off++) * in_, in_, ts.ep_ret_send.data() + row * in_);
  }
  fill(ret_rows_out, static_cast<size_t>(in_), cnt, dsp);
  const size_t ret_floats = fill(ret_rows_in, static_cast<size_t>(in_), cnt2, dsp2);
  ts.ep_ret_recv.resize(ret_floats);
  st = comm.all_to_all_v<float>(ts.ep_ret_send, cnt, dsp, ts.ep_ret_recv, cnt2, dsp2);
  if (!st.is_ok()) cell_failure(sh, st);

  // Traffic to other ranks.
  for (int p = 0; p < P; ++p) {
    if (p == me) continue;
    sh.traffic.count_bytes += sizeof(size_t);
    sh.traffic.dispatch_bytes += n_send[static_cast<size_t>(p)] * static_cast<size_t>(rec) * sizeof(float);
    sh.traffic.combine_bytes += ret_rows_out[static_cast<size_t>(p)] * static_cast<size_t>(in_) * sizeof(float);
  }
  ++sh.traffic.exchanges;

  // Combine: per token, its slots in ascending expert id (the single-process order).
  ts.acc.assign(static_cast<size_t>(T * in_), 0.0f);
  int slot[kMaxEpTopK];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < K_; ++i) slot[i] = static_cast<int>(i);
    const int* id = ids.data() + t * K_;
    std::sort(slot, slot + K_, [id](int a, int b) { return id[a] < id[b]; });
    for (int64_t k = 0; k < K_; ++k) {
      const size_t s = static_cast<size_t>(t * K_ + slot[k]);
      const size_t row = dsp2[static_cast<size_t>(owner[s])] / static_cast<size_t>(in_) + static_cast<size_t>(ep_slot_row_[s]);
      add_weighted(ts.acc.data() + t * in_, ts.ep_ret_recv.data() + row * static_cast<size_t>(in_), w_[s], in_);
    }
  }
}

}  // namespace kestrel
