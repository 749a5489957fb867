// libFuzzer target: `kestrel plan` cluster JSON on arbitrary bytes; specs that parse are validated
// and planned against a small fixed K3-shaped config, so the planner's arithmetic sees every value
// the parser lets through.
#include <cstddef>
#include <cstdint>
#include <string>

#include "plan/cluster.h"
#include "plan/planner.h"

namespace {

const char* kConfig = R"({"model_type": "kimi_k3", "text_config": {"model_type": "kimi_linear",
  "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 2, "intermediate_size": 512,
  "hidden_act": "silu", "rms_norm_eps": 1e-5, "attn_res_block_size": 2, "first_k_dense_replace": 1,
  "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 64,
  "routed_expert_hidden_size": 128, "q_lora_rank": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": true, "sparse_attn_layers": [4], "index_n_heads": 4,
  "index_head_dim": 128, "index_topk": 64, "linear_attn_config": {"num_heads": 2, "head_dim": 128,
  "short_conv_kernel_size": 4, "full_attn_layers": [2, 4], "kda_layers": [1, 3]}}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kestrel::ModelConfig cfg = *kestrel::parse_model_config(kConfig, "fuzz-config");
  auto spec = kestrel::plan::parse_cluster_spec(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!spec) return 0;
  auto p = kestrel::plan::make_plan(cfg, "fuzz", *spec);
  (void)p;
  return 0;
}
