// Feed-forward blocks: gated MLP (dense layer 0, shared experts, each routed expert) and the MoE
// block in both forms (docs/model-math.md §2.4 LatentMoE; §7.3 Kimi Linear MoE).
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu/gguf_int8.h"
#include "layers/binder.h"
#include "loader/model_config.h"

namespace kestrel {

// down(act(gate x, up x)); act = SwiGLU or SiTU-GLU per config.
class GatedMlp {
 public:
  // Names: <prefix><gate>.weight etc.; e.g. ("mlp.", "gate_proj", "up_proj", "down_proj") or
  // ("experts.3.", "w1", "w3", "w2").
  void bind(Binder& b, const std::string& prefix, const char* gate, const char* up, const char* down,
            int64_t in, int64_t inter, const TextConfig& c);
  // The dense FFN work (a dense layer's MLP, the shared experts): like bind(), but when the Binder's shard has
  // tp > 1 this rank binds only its slice of the intermediate columns (gate / up rows, down columns;
  // dist/tp_partition.h) and forward() runs tensor parallel over its TP group (docs/cell.md §7).
  void bind_dense(Binder& b, const std::string& prefix, const char* gate, const char* up, const char* down,
                  int64_t in, int64_t inter, const TextConfig& c);
  bool tensor_parallel() const { return tp_ != nullptr; }
  // x: [T, in] → y: [T, in]   (y overwritten). Tensor parallel: every rank of the cell calls it for the same
  // layer in the same step (T = 0 on a rank without tokens); aborts the process naming the rank when a
  // collective fails.
  void forward(const float* x, int64_t T, float* y);

  // The same computation in pieces, for callers that run several MLPs in one parallel region:
  // g, u [T, inter] = x Wg^T, x Wu^T;  g = act(g, u) over n elements;  y [T, in] = g Wd^T.
  void gate_up_tasks(const float* x, int64_t T, float* g, float* u, std::vector<kernels::MatmulTask>& out) const;
  void activate(float* g, const float* u, int64_t n) const;
  // Biased experts (gpt-oss): the gate / up biases added to columns [c0, c1) of `rows` rows of g and u (row
  // stride ld) before the activation, the down bias to columns [d0, d1) of y after the down product. No-ops
  // without biases. The pointers stay owned by the caller (MoeBlock keeps them for the model's life).
  void set_biases(const float* gate, const float* up, const float* down) { bg_ = gate, bu_ = up, bd_ = down; }
  bool biased() const { return bg_ != nullptr; }
  void add_gate_up_bias(float* g, float* u, int64_t rows, int64_t ld, int64_t c0, int64_t c1) const;
  void add_down_bias(float* y, int64_t rows, int64_t ld, int64_t d0, int64_t d1) const;
  kernels::MatmulTask down_task(const float* h, int64_t T, float* y) const { return {&wd_, h, T, y}; }
  const kernels::WeightMatrix& gate_weight() const { return wg_; }
  const kernels::WeightMatrix& up_weight() const { return wu_; }
  const kernels::WeightMatrix& down_weight() const { return wd_; }

 private:
  // Tensor parallel: gather the group's rows, this slice's partial output for all of them, return each
  // member its rows, sum the members' partials in group order.
  void forward_tp(const float* x, int64_t T, float* y);

  const TextConfig* c_ = nullptr;
  kernels::WeightMatrix wg_, wu_, wd_;
  const float *bg_ = nullptr, *bu_ = nullptr, *bd_ = nullptr;
  std::vector<kernels::MatmulTask> tasks_;
  // Tensor parallel (null: every column bound). The down slice is a copy (a row's slice is not contiguous).
  ExpertShard* tp_ = nullptr;
  std::vector<uint64_t> down_store_;
  std::vector<size_t> tp_counts_[7];
  // A call's temporaries, shared by the MLPs of the calling thread (layers/shared_temps.h): gate and up
  // rows; in a TP group the gathered rows, this slice's partials and the partials received.
  struct Temps {
    std::vector<float> g, u, tp_x, tp_part, tp_recv;
  };
};

// The single-process MoE experts on GGUF int8 weights run in one parallel region (moe_fused.cpp) unless
// this is off (KESTREL_MOE_FUSED=0, or set in code: tests compare the two paths bit for bit).
bool moe_fused_enabled();
void set_moe_fused(bool on);

// Per-expert tensor names: Moonshot's w1/w3/w2 (Kimi) or HF's gate_proj/up_proj/down_proj (DeepSeek).
struct ExpertNames {
  const char* gate = "w1";
  const char* up = "w3";
  const char* down = "w2";
};
inline constexpr ExpertNames kHfExpertNames{"gate_proj", "up_proj", "down_proj"};

// Routing (docs/model-math.md §7), fp32: scores = sigmoid or softmax of the router logits (+ the router's own
// bias where it has one, gpt-oss); the
// choice uses scores + e_score_correction_bias (when present); with n_group > 1 only the top
// topk_group groups (group score = sum of the top-2 biased scores, or the max without a bias) are
// eligible (others −inf); weights = the chosen UNBIASED scores, renormalised (norm_topk_prob) and
// × routed_scaling_factor (after renormalising, as V3 / vLLM do; DeepSeek-V2's own code skipped the
// scale when it renormalised, a combination no released config uses). Ties go to the lower index.
//
// In a cell (the Binder carries an ExpertShard of size > 1) the block binds only this rank's routed experts;
// forward() then routes locally, dispatches each token once to every rank owning one of its experts (the
// routed-expert input row: latent width under LatentMoE), runs the rows that arrive on the owned experts,
// sends every (token, expert slot) output back, and combines on the token's rank in the single-process order
// (ascending expert id per token), so the result is bit-identical to one process. Every rank must call
// forward() once per MoE layer per step, with T = 0 when it has no tokens.
class MoeBlock {
 public:
  Status bind(Binder& b, const std::string& prefix, const TextConfig& c, const ExpertNames& names = {});
  // x: [T, hidden] post-attention-normed → out: [T, hidden]. Aborts the process naming the rank when a
  // collective fails (the cell cannot continue; docs/cell.md).
  void forward(const float* x, int64_t T, float* out);

  // Routing alone (exposed for tests): ids/weights [T, top_k].
  void route(const float* x, int64_t T, std::vector<int>& ids, std::vector<float>& weights);

 private:
  // Top-k selection from router logits already in Temps::logits [T, E].
  void select(int64_t T, std::vector<int>& ids, std::vector<float>& weights);
  // The routed experts of a cell: dispatch, owned experts, combine into Temps::acc [T, in_].
  void routed_ep(const float* in, int64_t T);
  // One process, tokens already listed per expert in by_expert_: routed experts' weighted sum into Temps::acc
  // [T, in_] and the shared experts into Temps::shared_out [T, hidden]; x is the layer input, in the routed input.
  void forward_grouped(const float* x, const float* in, int64_t T);
  // The same in one parallel region on GGUF int8 weights (moe_fused.cpp), where fused_applies(T).
  void bind_fused();
  bool fused_applies(int64_t T) const;
  void forward_fused(const float* x, const float* in, int64_t T);
  bool sharded() const { return shard_ != nullptr && shard_->size > 1; }
  static constexpr int64_t kMaxEpTopK = 64;

  const TextConfig* c_ = nullptr;
  int64_t E_ = 0, K_ = 0, in_ = 0;  // in_ = latent width (LatentMoE) or hidden
  // Biases of the router's logits and of the experts' gate / up [E, inter] and down [E, in] (gpt-oss).
  void add_router_bias(int64_t T);
  void add_gate_up_biases();
  void add_down_biases();
  kernels::WeightMatrix router_, lat_down_, lat_up_;
  std::vector<float> bias_, lat_norm_, logit_bias_, gate_bias_, up_bias_, down_bias_;
  std::vector<GatedMlp> experts_;
  GatedMlp shared_;
  bool has_shared_ = false;
  ExpertShard* shard_ = nullptr;  // cells: this rank's experts and the communicator
  // A call's temporaries, shared by the MoE blocks of the calling thread (layers/shared_temps.h): router
  // logits, the latent input, the combined routed output, gathered expert inputs, expert outputs, the
  // shared experts' output, gate/up rows (routed, shared); the fused path's quantized inputs and rows and
  // each routed row's token, index and weight; the cell's send / receive buffers.
  struct Temps {
    std::vector<float> logits, z, acc, gathered, eout, shared_out, g, u, sg, su;
    kernels::Q8Acts fx, fxs, fh, fsh;
    std::vector<int32_t> fused_tok, fused_row;
    std::vector<float> fused_w;
    std::vector<float> ep_send, ep_recv, ep_ret_send, ep_ret_recv;
  };
  // Small per-call lists, kept with the block.
  std::vector<kernels::MatmulTask> tasks_, down_;
  std::vector<int> ids_, route_ids_;
  std::vector<float> w_, sel_, score_, group_score_;
  std::vector<int> group_order_;
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert_;
  // Fused path (moe_fused.cpp): whether every expert matrix is a GGUF int8 format with 128-aligned
  // intermediate widths; the active experts and the work items of the two phases (its quantized inputs
  // and rows are in Temps: fx; fxs for the shared experts when their input differs; fh routed, fsh shared).
  struct FusedExpert {
    int64_t e, off, n;
  };
  struct FusedItem {
    int32_t expert;  // index into fused_experts_, −1 for the shared experts
    int64_t r0, r1;
  };
  bool fused_formats_ = false;
  std::vector<FusedExpert> fused_experts_;
  std::vector<FusedItem> fused_items_;
  // Cell scratch: per-rank counts and displacements,
  // received (record row, return row) pairs per owned expert, and each local slot's output row.
  std::vector<size_t> ep_counts_[8];
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ep_by_expert_;
  std::vector<int64_t> ep_slot_row_;
  std::vector<int> ep_order_;
};

}  // namespace kestrel
