// GGUF tensors presented under the Hugging Face names the Binder asks for (K3 with or without the
// `language_model.` prefix; Kimi Linear; DeepSeek V3 / Kimi K2 `deepseek2`, whose MoE lives under
// `mlp.` with experts.E.{gate,up,down}_proj; Qwen3-MoE `qwen3moe`; gpt-oss `gpt-oss`, bound under those names
// plus its q/k/v/o biases, sinks, router bias and `mlp.experts.{gate,up,down}_proj_bias` [E, n], its
// post-attention norm written as post_attention_norm). This inverts what llama.cpp's converter does
// (conversion/kimi_k3.py, conversion/kimi_linear.py, conversion/deepseek.py, conversion/qwen.py,
// conversion/gpt_oss.py, gguf-py tensor_mapping.py):
//   renames                      model.layers.L.self_attn.q_proj → blk.L.attn_q, … (table in the .cpp)
//   experts stacked to 3-D       experts.E.w1/w3/w2 → ffn_{gate,up,down}_exps ne [in, out, n_expert]:
//                                expert E is rows [E·out, (E+1)·out) — a zero-copy view (any type)
//   conv1d reshaped              [P, 1, W] ↔ ne [W, 1, P, 1]: same bytes, zero-copy
//   A_log → −exp(A_log) (f32)    inverted as log(−x) into an owned copy (≤ 1 ulp from the original
//                                after our exp; K3's head_dim padding was sliced off, so shape [H])
//   dt_bias → ssm_dt.bias        rename
//   <x>_res_norm ⊙ <x>_res_proj  fused into <x>_res_score; presented as norm = score, proj = ones
//                                (the model multiplies them back: score · 1 is exact)
//   kv_b_proj split              attn_k_b ne [dn, lora, H] (transposed) + attn_v_b ne [lora, dv, H]:
//                                re-merged into an owned F32 [H·(dn+dv), lora] copy (the transpose
//                                forces a copy; quantized halves are decoded exactly first)
// Weights in F32/F16/BF16/Q8_0/Q4_0/MXFP4 are used in place from the mmap; other ggml types fail with
// a one-line error naming the tensor. Every GGUF tensor must be consumed (like Checkpoint::unused).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/aligned_vector.h"
#include "base/progress.h"
#include "base/result.h"
#include "kernels/cpu/linear.h"
#include "loader/gguf.h"
#include "tensor/tensor.h"

namespace kestrel {

class GgufWeights {
 public:
  static Result<std::unique_ptr<GgufWeights>> open(const std::string& path);
  explicit GgufWeights(GgufFile file) : file_(std::move(file)) {}

  const GgufFile& file() const { return file_; }
  const std::string& path() const { return file_.path(); }
  // Linear weight [out, in] named by its HF prefix (no ".weight").
  Result<kernels::WeightMatrix> linear(const std::string& hf_name, int64_t out, int64_t in);
  // The two halves of an MLA kv_b_proj as the converter stores them, used in place (no copy):
  // k_b^T as [H·lora, dn] (row h·lora + c: head h, latent c) and v_b as [H·dv, lora]. nullopt when
  // the file has a plain kv_b (not split). The absorbed (MQA) decode maps q into the latent space
  // and the latent output back with exactly these products. Does not mark the tensors used
  // (linear(kv_b_proj) does).
  std::optional<std::pair<kernels::WeightMatrix, kernels::WeightMatrix>> split_kv_b(const std::string& hf_kv_b, int64_t heads,
                                                                                  int64_t dn, int64_t dv, int64_t lora);
  // Float tensor (F32/F16/BF16) by HF name; shape must match when non-empty.
  Result<TensorView> get(const std::string& hf_name, const std::vector<int64_t>& shape);
  // GGUF tensors never consumed.
  std::vector<std::string> unused() const;
  // Binding progress on a terminal (base/progress.h), as Checkpoint::show_progress.
  void show_progress(const std::string& label);
  void finish_progress() { progress_.reset(); }

 private:
  const GgufTensorInfo* find(const std::string& gguf_name);
  Status error(const std::string& gguf_name, const std::string& what) const;
  // pack: give Q4_0 matrices their row-interleaved copy for the int8 products (WeightMatrix::packed).
  Result<kernels::WeightMatrix> matrix(const GgufTensorInfo& t, int64_t out, int64_t in, int64_t row0, bool pack = true);
  Result<kernels::WeightMatrix> merged_kv_b(const std::string& layer, int64_t out, int64_t in);
  Result<TensorView> float_view(const GgufTensorInfo& t, std::vector<int64_t> shape);

  GgufFile file_;
  std::set<std::string> used_;
  std::deque<std::vector<float>> owned_;  // transformed copies (stable addresses)
  std::deque<AlignedVector<uint8_t>> packed_;  // Q4_0 rows in groups of 16 (kernels/cpu/gguf_q4_x16.h)
  std::unique_ptr<Progress> progress_;
};

}  // namespace kestrel
