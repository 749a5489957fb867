// The K3 vision tower's config (`vision_config` of config.json: MoonViT3d encoder + PatchMergerMLPV2 projector)
// and the tensors it implies in the released checkpoint layout (docs/model-math.md §1.3): names, dtypes, shapes.
// The text path validates a checkpoint's vision tensors against this list; `kestrel plan` counts them from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "loader/checkpoint.h"
#include "tensor/dtype.h"

namespace kestrel {

struct VisionConfig {
  int num_layers = 0;         // vt_num_hidden_layers (K3: 27)
  int hidden = 0;             // vt_hidden_size (1024)
  int intermediate = 0;       // vt_intermediate_size (4096)
  int num_heads = 0;          // vt_num_attention_heads (12)
  int qkv_hidden = 0;         // qkv_hidden_size (1536 = 12 heads x 128; differs from hidden)
  int patch_size = 0;         // patch_size (14)
  int pos_emb_height = 0;     // init_pos_emb_height (64)
  int pos_emb_width = 0;      // init_pos_emb_width (64)
  int merge_h = 0, merge_w = 0;  // merge_kernel_size ([2, 2])
  int mm_hidden = 0;          // mm_hidden_size (1024; defaults to vt_hidden_size)
  int text_hidden = 0;        // text_hidden_size (7168: the language model's hidden size)
  float projector_ln_eps = 1e-5f;  // projector_ln_eps: the projector's post RMSNorm
  // The MoonViT3d choices the released config names (pos_emb_type divided_fixed, bilinear pos-emb
  // interpolation, rmsnorm, mlp2 with gelu_pytorch_tanh, sd2_tpool merge, patchmergerv2 with exact gelu, no
  // biases) are the only ones Kestrel runs; parse_vision_config refuses any other value.

  int64_t merged_width() const { return int64_t{mm_hidden} * merge_h * merge_w; }  // projector input (4096)
};

// Parses the `vision_config` object (its JSON text); `where` names the file in errors.
Result<VisionConfig> parse_vision_config(const std::string& json_text, const std::string& where);

struct VisionTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Every tensor of the tower and projector in the released layout, in checkpoint order (all bf16, no biases).
std::vector<VisionTensor> vision_tensors(const VisionConfig& v);

// True for names under the vision tower or projector (`vision_tower.*`, `mm_projector.*`).
bool is_vision_tensor_name(const std::string& name);

struct VisionTensorCount {
  int64_t tensors = 0;
  int64_t params = 0;
};

// Checks a checkpoint's vision tensors against its vision_config and marks them used, without reading
// their data: either none (a text-only checkpoint) or exactly vision_tensors(config), each bf16 with its
// shape. A missing, extra (unknown name), mistyped or misshapen tensor is an error naming file and tensor;
// so is a vision_config that does not parse, or whose text_hidden_size is not `text_hidden_size`.
Result<VisionTensorCount> check_vision_tensors(Checkpoint& ck, const std::string& vision_config_json,
                                               int text_hidden_size);

}  // namespace kestrel
