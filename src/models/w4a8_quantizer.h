// `kestrel quantize`'s conversion: a BF16 checkpoint → our W4A8 format (kernels/cpu/w4a8_format.h),
// written in the released layout (shards + index + config.json with a compressed-tensors
// quantization_config) so compressed-tensors / vLLM read it too.
//
// Quantized (int4, one bf16 scale per `group_size` inputs, int8 dynamic per-token activations):
// every 2-D float `*.weight` the model binds as a linear layer — attention projections (KDA q/k/v/
// f/g/b/o, MLA q_a/q_b/kv_a/kv_b/g/o), dense MLP, shared experts, LatentMoE down/up projections and
// BF16 routed experts. Kept as they are: embeddings, lm_head (unless quantize_lm_head), the router
// gate, AttnRes projections, norms, convolutions, biases, and MXFP4 experts (already 4-bit).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel {

struct QuantizeOptions {
  std::string in_dir, out_dir;
  int group_size = 32;  // 32, 64 or 128
  bool quantize_lm_head = false;
};

struct QuantizeSummary {
  int quantized = 0;    // linear weights now W4A8
  int kept_mxfp4 = 0;   // MXFP4 linear weights copied as is
  int copied = 0;       // other tensors copied verbatim
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Called after each input tensor: (done, total, tensor name).
using QuantizeProgress = std::function<void(size_t, size_t, const std::string&)>;

// Whether a tensor becomes W4A8 under these options (name, shape of the float weight).
bool is_w4a8_target(const std::string& name, const std::vector<int64_t>& shape, const QuantizeOptions& opt);

Result<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& opt, const QuantizeProgress& progress = nullptr);

}  // namespace kestrel
