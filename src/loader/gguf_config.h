// Typed ModelConfig from the metadata of a GGUF written by llama.cpp's converter for the `kimi-k3`,
// `kimi-linear` and `deepseek2` (DeepSeek V3 / Kimi K2: a deepseek_v3 config) architectures. The keys are translated into the Hugging Face config.json form
// and parsed by parse_model_config, so both sources get the same validation and derived fields.
// Some HF fields have no key and are read off the tensor list (GGUF has them only implicitly):
//   mla_use_output_gate ← blk.*.attn_gate present; use_full_rank_gate ← blk.*.ssm_g present;
//   latent_moe_use_norm ← blk.*.ffn_routed_norm present; tie_word_embeddings ← no output.weight;
//   KDA / MLA layer lists ← attention.head_count_kv (0 marks a KDA layer).
#pragma once

#include <string>

#include "base/result.h"
#include "loader/gguf.h"
#include "loader/model_config.h"

namespace kestrel {

// `label` names the file in errors.
Result<ModelConfig> model_config_from_gguf(const GgufHeader& h, const std::string& label);

// The HF-form JSON text built from the metadata (exposed for tests and error reports).
Result<std::string> gguf_to_hf_config_json(const GgufHeader& h, const std::string& label);

}  // namespace kestrel
