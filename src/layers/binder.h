// Strict, by-name weight binding from a Checkpoint or a GGUF file (GgufWeights answers the HF names).
// The first failure is kept (with the file and tensor named) and later calls become no-ops, so layer
// bind() code reads straight through.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/result.h"
#include "kernels/cpu/linear.h"
#include "layers/expert_shard.h"
#include "layers/gguf_weights.h"
#include "loader/checkpoint.h"

namespace kestrel {

class Binder {
 public:
  explicit Binder(Checkpoint& ckpt) : ckpt_(&ckpt) {}
  explicit Binder(GgufWeights& gguf) : gguf_(&gguf) {}
  const Status& status() const { return st_; }
  bool ok() const { return st_.is_ok(); }

  // Linear weight [out, in]: `<name>.weight` (F32/BF16/F16), or `<name>.weight` F8_E4M3 +
  // `<name>.weight_scale_inv` F32 [ceil(out/128), ceil(in/128)] (DeepSeek FP8 blocks), or, when present,
  // compressed-tensors `<name>.weight_packed` + `<name>.weight_scale`, told apart by the packed dtype:
  //   U8 [out, in/2] + U8 [out, in/32]                      MXFP4 (E2M1 codes, E8M0 scales);
  //   I32 [out, in/8] + BF16 [out, in/G] + weight_shape [2]  int4 pack-quantized W4A8, G from the
  //                                                          config (set_int4_group_size).
  kernels::WeightMatrix linear(const std::string& name, int64_t out, int64_t in);
  // Checkpoint only: float tensor `<name>.weight` of exactly `shape`, used in place as an [out, in] matrix with
  // out = shape[0] and in = the product of the rest (a Conv2d whose kernel equals its stride, over patches
  // flattened in the kernel's (channel, row, column) order).
  kernels::WeightMatrix flattened(const std::string& name, const std::vector<int64_t>& shape);
  // GGUF only: kv_b_proj's converter halves in place (GgufWeights::split_kv_b); nullopt otherwise.
  std::optional<std::pair<kernels::WeightMatrix, kernels::WeightMatrix>> split_kv_b(const std::string& name, int64_t heads,
                                                                                  int64_t dn, int64_t dv, int64_t lora) {
    if (gguf_ == nullptr || !ok()) return std::nullopt;
    return gguf_->split_kv_b(name, heads, dn, dv, lora);
  }
  // Group size the config declares for pack-quantized int4 weights (0: none declared → an int4
  // tensor is an error).
  void set_int4_group_size(int64_t g) { int4_group_ = g; }
  // Cells: the expert shard of this rank (null or size 1: every expert is bound). Not owned.
  void set_expert_shard(ExpertShard* shard) { shard_ = shard; }
  ExpertShard* expert_shard() const { return shard_; }
  // Another rank's linear weight: its tensors (any of the formats linear() reads) are accounted for without
  // being read, so the strict unused-tensor check passes and none of its bytes count as bound. Checkpoints
  // only: a GGUF file stacks every expert of a layer in one tensor, which cannot be split this way.
  void skip_linear(const std::string& name);
  // Tensor parallelism (docs/cell.md §7), checkpoints only. The block a linear weight can be cut on: 1 for
  // F32 / BF16 / F16, 128 for FP8 blocks; other formats (MXFP4, int4, GGUF) fail with a clear error (0).
  int64_t tp_block(const std::string& name);
  // Rows [r0, r1) of linear weight [out, in] (r0 on a block boundary): a view into the mapped tensor. Only
  // the slice's bytes (and its FP8 scale rows) count as bound.
  kernels::WeightMatrix linear_rows(const std::string& name, int64_t out, int64_t in, int64_t r0, int64_t r1);
  // Columns [c0, c1) of linear weight [out, in] (c0 on a block boundary, c1 on one or = in): a row's slice is
  // not contiguous, so the slice (and its FP8 scale columns) is copied into `store`, which must outlive the
  // matrix. Only those bytes count as bound.
  kernels::WeightMatrix linear_cols(const std::string& name, int64_t out, int64_t in, int64_t c0, int64_t c1,
                                    std::vector<uint64_t>& store);
  // Any float tensor converted to fp32; shape must match exactly.
  std::vector<float> vec(const std::string& name, const std::vector<int64_t>& shape);
  // Float tensor whose shape is one of `shapes` (first match wins).
  std::vector<float> vec_any(const std::string& name, const std::vector<std::vector<int64_t>>& shapes);
  void fail(Status s) {
    if (st_.is_ok()) st_ = std::move(s);
  }

 private:
  kernels::WeightMatrix int4_linear(Checkpoint& ck, const std::string& name, int64_t out, int64_t in);
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& shape);
  std::string file_of(const std::string& name) const;

  Checkpoint* ckpt_ = nullptr;  // exactly one source is set
  GgufWeights* gguf_ = nullptr;
  Status st_;
  int64_t int4_group_ = 0;
  ExpertShard* shard_ = nullptr;
};

// Binds every tensor of a GGUF file through `bind` (a model's bind(Binder&)), with the binding progress shown;
// a tensor the model did not use is an error naming it, as for a checkpoint.
template <class BindFn>
Status bind_whole_gguf(GgufWeights& g, const std::string& label, const std::string& model_type, BindFn&& bind) {
  g.show_progress("loading " + label);
  Binder b(g);
  KESTREL_RETURN_IF_ERROR(bind(b));
  g.finish_progress();
  const auto unused = g.unused();
  if (!unused.empty())
    return corrupt(label + ": unexpected tensor '" + unused.front() + "' (" + std::to_string(unused.size()) +
                   " tensor(s) not used by " + model_type + ")");
  return Status::ok();
}

// The same for a checkpoint directory: `bind` (a model's bind, plus whatever else it binds or accepts), with the
// binding progress shown, then a tensor nothing used is an error naming its file. A cell rank's shard and a W4A8
// checkpoint's int4 group size are set on the Binder first.
template <class BindFn>
Status bind_whole_checkpoint(Checkpoint& ck, const std::string& dir, const std::string& model_type, ExpertShard* shard,
                             int64_t int4_group_size, BindFn&& bind) {
  ck.show_progress("loading " + dir);
  Binder b(ck);
  b.set_int4_group_size(int4_group_size);
  b.set_expert_shard(shard);
  KESTREL_RETURN_IF_ERROR(bind(b));
  ck.finish_progress();
  const auto unused = ck.unused();
  if (!unused.empty())
    return corrupt(ck.file_of(unused.front()) + ": unexpected tensor '" + unused.front() + "' (" +
                   std::to_string(unused.size()) + " tensor(s) not used by " + model_type + ")");
  return Status::ok();
}

}  // namespace kestrel
