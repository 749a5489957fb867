// Strict, by-name weight binding from a Checkpoint or a GGUF file (GgufWeights answers the HF names).
// The first failure is kept (with the file and tensor named) and later calls become no-ops, so layer
// bind() code reads straight through.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "kernels/cpu/linear.h"
#include "layers/gguf_weights.h"
#include "loader/checkpoint.h"

namespace kestrel {

class Binder {
 public:
  explicit Binder(Checkpoint& ckpt) : ckpt_(&ckpt) {}
  explicit Binder(GgufWeights& gguf) : gguf_(&gguf) {}
  const Status& status() const { return st_; }
  bool ok() const { return st_.is_ok(); }

  // Linear weight [out, in]: `<name>.weight` (F32/BF16/F16) or, when present,
  // `<name>.weight_packed` + `<name>.weight_scale` (compressed-tensors MXFP4), or `<name>.weight`
  // F8_E4M3 + `<name>.weight_scale_inv` F32 [ceil(out/128), ceil(in/128)] (DeepSeek FP8 blocks).
  kernels::WeightMatrix linear(const std::string& name, int64_t out, int64_t in);
  // Any float tensor converted to fp32; shape must match exactly.
  std::vector<float> vec(const std::string& name, const std::vector<int64_t>& shape);
  // Float tensor whose shape is one of `shapes` (first match wins).
  std::vector<float> vec_any(const std::string& name, const std::vector<std::vector<int64_t>>& shapes);
  void fail(Status s) {
    if (st_.is_ok()) st_ = std::move(s);
  }

 private:
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& shape);
  std::string file_of(const std::string& name) const;

  Checkpoint* ckpt_ = nullptr;  // exactly one source is set
  GgufWeights* gguf_ = nullptr;
  Status st_;
};

}  // namespace kestrel
