#include "models/checkpoint_generator.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loader/vision_config.h"
#include "models/checkpoint_writer.h"

namespace kestrel {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using gen_detail::Rng;
using gen_detail::Writer;

bool is_sparse(const GenSpec& s, int l) {
  for (int f : s.sparse_attn_layers)
    if (f == l + 1) return true;
  return false;
}

bool is_mla(const GenSpec& s, int l) {
  for (int f : s.full_attn_layers)
    if (f == l + 1) return true;
  return false;
}

void write_kda(Writer& w, const GenSpec& s, const std::string& p) {
  const int64_t H = s.kda_heads, D = s.head_dim, P = H * D, hid = s.hidden;
  w.linear(p + "q_proj", P, hid);
  w.linear(p + "k_proj", P, hid);
  w.linear(p + "v_proj", P, hid);
  for (const char* c : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"})
    w.f32(p + c, {P, 1, 4}, [](Rng& r, int64_t) { return 0.6f * r.sym(); });
  w.linear(p + "f_a_proj", D, hid);
  w.linear(p + "f_b_proj", P, D);
  w.linear(p + "b_proj", H, hid);
  // fla init: dt ~ logU(1e-3, 0.1), dt_bias = inverse softplus(dt); A ~ U(1, 16).
  w.f32(p + "dt_bias", {P}, [](Rng& r, int64_t) {
    const float dt = std::exp(r.uniform() * (std::log(0.1f) - std::log(1e-3f)) + std::log(1e-3f));
    return dt + std::log(-std::expm1(-dt));
  });
  const std::vector<int64_t> a_shape = s.pad_a_log ? std::vector<int64_t>{std::max<int64_t>(D, H)}
                                                   : std::vector<int64_t>{1, 1, H, 1};
  w.f32(p + "A_log", a_shape, [H](Rng& r, int64_t i) { return i < H ? std::log(1.0f + 15.0f * r.uniform()) : 0.0f; });
  w.f32(p + "o_norm.weight", {D}, [](Rng& r, int64_t) { return 1.0f + 0.1f * r.sym(); });
  if (s.arch == "kimi_k3") {
    w.linear(p + "g_proj", P, hid);
  } else {
    w.linear(p + "g_a_proj", D, hid);
    w.linear(p + "g_b_proj", P, D);
  }
  w.linear(p + "o_proj", hid, P);
}

// DeepSeek-V3.2 indexer tensors (docs/model-math.md §6.2), bf16.
void write_indexer(Writer& w, const GenSpec& s, const std::string& p) {
  w.linear(p + "wq_b", static_cast<int64_t>(s.index_heads) * s.index_dim, s.q_lora);
  w.linear(p + "wk", s.index_dim, s.hidden);
  w.norm(p + "k_norm.weight", s.index_dim);
  w.bf16(p + "k_norm.bias", {s.index_dim}, 0.1f);
  w.linear(p + "weights_proj", s.index_heads, s.hidden);
}

void write_mla(Writer& w, const GenSpec& s, const std::string& p) {
  const int64_t nh = s.mla_heads, hid = s.hidden, qk = s.nope + s.rope;
  if (s.q_lora > 0) {
    w.linear(p + "q_a_proj", s.q_lora, hid);
    w.norm(p + "q_a_layernorm.weight", s.q_lora);
    w.linear(p + "q_b_proj", nh * qk, s.q_lora);
  } else {
    w.linear(p + "q_proj", nh * qk, hid);
  }
  w.linear(p + "kv_a_proj_with_mqa", s.kv_lora + s.rope, hid);
  w.norm(p + "kv_a_layernorm.weight", s.kv_lora);
  w.linear(p + "kv_b_proj", nh * (s.nope + s.v_dim), s.kv_lora);
  if (s.arch == "kimi_k3") w.linear(p + "g_proj", nh * s.v_dim, hid);
  w.linear(p + "o_proj", hid, nh * s.v_dim);
}

void write_moe(Writer& w, const GenSpec& s, const std::string& p) {
  const bool k3 = s.arch == "kimi_k3";
  const int64_t hid = s.hidden, in = k3 ? s.latent : s.hidden;
  w.bf16(p + "gate.weight", {s.experts, hid}, std::sqrt(3.0f / static_cast<float>(hid)));
  w.f32(p + "gate.e_score_correction_bias", {s.experts}, [](Rng& r, int64_t) { return 0.05f * r.sym(); });
  if (k3) {
    w.linear(p + "routed_expert_down_proj", s.latent, hid);
    w.norm(p + "routed_expert_norm.weight", s.latent);
    w.linear(p + "routed_expert_up_proj", hid, s.latent);
  }
  for (int e = 0; e < s.experts; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    if (s.mxfp4_experts) {
      w.mxfp4(ep + "w1", s.moe_inter, in);
      w.mxfp4(ep + "w3", s.moe_inter, in);
      w.mxfp4(ep + "w2", in, s.moe_inter);
    } else {
      w.linear(ep + "w1", s.moe_inter, in);
      w.linear(ep + "w3", s.moe_inter, in);
      w.linear(ep + "w2", in, s.moe_inter);
    }
  }
  if (s.shared > 0) {
    const int64_t sw = static_cast<int64_t>(s.shared) * s.moe_inter;
    w.linear(p + "shared_experts.gate_proj", sw, hid);
    w.linear(p + "shared_experts.up_proj", sw, hid);
    w.linear(p + "shared_experts.down_proj", hid, sw);
  }
}

json text_config(const GenSpec& s) {
  const bool k3 = s.arch == "kimi_k3";
  std::vector<int> kda;
  for (int l = 0; l < s.layers; ++l)
    if (!is_mla(s, l)) kda.push_back(l + 1);
  json la = {{"num_heads", s.kda_heads}, {"head_dim", s.head_dim}, {"short_conv_kernel_size", 4},
             {"full_attn_layers", s.full_attn_layers}, {"kda_layers", kda}};
  if (k3) la["use_full_rank_gate"] = true, la["gate_lower_bound"] = -5.0;
  json t = {{"architectures", {"KimiLinearForCausalLM"}}, {"model_type", "kimi_linear"},
            {"vocab_size", s.vocab}, {"hidden_size", s.hidden}, {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.mla_heads}, {"num_key_value_heads", s.mla_heads},
            {"intermediate_size", s.intermediate}, {"hidden_act", k3 ? "situ" : "silu"},
            {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 1048576},
            {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"num_experts", s.experts},
            {"num_experts_per_token", s.top_k}, {"num_shared_experts", s.shared},
            {"moe_intermediate_size", s.moe_inter}, {"moe_router_activation_func", "sigmoid"},
            {"use_grouped_topk", true}, {"num_expert_group", 1}, {"topk_group", 1},
            {"moe_renormalize", true}, {"routed_scaling_factor", s.routed_scaling},
            {"q_lora_rank", s.q_lora > 0 ? json(s.q_lora) : json(nullptr)}, {"kv_lora_rank", s.kv_lora},
            {"qk_nope_head_dim", s.nope}, {"qk_rope_head_dim", s.rope}, {"v_head_dim", s.v_dim},
            {"mla_use_nope", true}, {"num_nextn_predict_layers", 0}, {"tie_word_embeddings", false},
            {"bos_token_id", s.vocab - 256}, {"eos_token_id", s.vocab - 254}, {"pad_token_id", s.vocab - 1},
            {"linear_attn_config", la}, {"dtype", "bfloat16"}};
  if (k3) {
    t["activation_situ_beta"] = 4.0;
    t["activation_situ_linear_beta"] = 25.0;
    t["attn_res_block_size"] = s.attn_res_block;
    t["routed_expert_hidden_size"] = s.latent;
    t["latent_moe_use_norm"] = true;
    t["mla_use_output_gate"] = true;
    t["topk_method"] = "noaux_tc";
  }
  if (!s.sparse_attn_layers.empty()) {
    t["sparse_attn_layers"] = s.sparse_attn_layers;
    t["index_n_heads"] = s.index_heads;
    t["index_head_dim"] = s.index_dim;
    t["index_topk"] = s.index_topk;
    if (s.index_rope >= 0) t["index_rope_head_dim"] = s.index_rope;
  }
  if (s.mxfp4_experts) {
    t["quantization_config"] = {
        {"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"},
        {"quantization_status", "compressed"},
        {"config_groups", {{"group_0", {{"format", "mxfp4-pack-quantized"}, {"targets", {"Linear"}},
                                        {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 32},
                                                     {"strategy", "group"}, {"symmetric", true},
                                                     {"scale_dtype", "torch.uint8"}}}}}}},
        {"ignore", {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                    "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"}}};
  }
  return t;
}

// K3's vision_config with every key of the released one (docs/configs/kimi-k3/config.json), widths from the spec.
json vision_config(const GenSpec& s) {
  return {{"patch_size", s.vt_patch}, {"init_pos_emb_height", s.vt_pos_grid}, {"init_pos_emb_width", s.vt_pos_grid},
          {"init_pos_emb_time", 4}, {"pos_emb_type", "divided_fixed"}, {"pos_emb_interpolation_mode", "bilinear"},
          {"vt_num_hidden_layers", s.vt_layers}, {"vt_hidden_size", s.vt_hidden},
          {"vt_intermediate_size", s.vt_intermediate}, {"vt_num_attention_heads", s.vt_heads},
          {"qkv_hidden_size", s.vt_qkv}, {"merge_kernel_size", {2, 2}}, {"merge_type", "sd2_tpool"},
          {"mm_projector_type", "patchmergerv2"}, {"mm_hidden_size", s.vt_hidden}, {"projector_hidden_act", "gelu"},
          {"projector_ln_eps", 1e-5}, {"text_hidden_size", s.hidden}, {"norm_type", "rmsnorm"}, {"mlp_type", "mlp2"},
          {"activation_func", "gelu_pytorch_tanh"}, {"attn_bias", false}, {"linear_bias", false},
          {"patch_embed_proj_bias", false}};
}

// The tower and projector tensors vision_config implies (loader/vision_config.h), after the text tensors as in
// the release; RMSNorm weights near 1, the rest uniform with a 1/sqrt(fan-in) scale.
Status write_vision(Writer& w, const json& vision) {
  auto v = parse_vision_config(vision.dump(), "generated");
  if (!v) return v.error();
  for (const VisionTensor& t : vision_tensors(*v)) {
    if (t.shape.size() == 1) {
      w.norm(t.name, t.shape[0]);
    } else {
      int64_t fan_in = 1;
      for (size_t i = 1; i < t.shape.size(); ++i) fan_in *= t.shape[i];
      if (t.name.find("pos_emb") != std::string::npos) fan_in = 1;
      w.bf16(t.name, t.shape, 1.0f / std::sqrt(static_cast<float>(fan_in)));
    }
  }
  return Status::ok();
}

}  // namespace

std::vector<std::string> gen_preset_names() {
  return {"k3-tiny",  "k3-tiny-bf16", "k3-tiny-allexp",   "kimi-linear-tiny",
          "k3-bench", "k3-default",   "deepseek-v3-tiny", "deepseek-v32-tiny", "deepseek-v32-sparse-tiny", "deepseek-v2style-tiny",
          "deepseek-v3-micro-bf16", "deepseek-v2-lite-micro-bf16", "deepseek2-lite-bench",
          "deepseek-bench", "deepseek-bench-dsa", "k3-micro", "k3-micro-bf16", "kimi-linear-micro", "k3-tiny-dsa", "k3-bench-dsa",
          "kimi-linear-bench", "k3-shape-bench", "qwen3moe-micro-bf16", "qwen3moe-bench", "gptoss-bench"};
}

Result<GenSpec> gen_preset(const std::string& name) {
  GenSpec s;
  if (name == "k3-tiny") return s;
  if (name == "k3-tiny-bf16") return s.mxfp4_experts = false, s;
  if (name == "k3-tiny-allexp") return s.top_k = s.experts, s;  // MXFP4, every expert routed (no routing flips)
  if (name == "kimi-linear-tiny") {
    s.arch = "kimi_linear";
    s.layers = 6;
    s.full_attn_layers = {4, 6};
    s.q_lora = 0;
    s.experts = 8, s.top_k = 2, s.shared = 1, s.moe_inter = 64;
    s.mxfp4_experts = false;
    s.routed_scaling = 2.446f;
    s.pad_a_log = false;
    return s;
  }
  // Micro presets (about 1M parameters) for the committed GGUF test files: every matrix input width a
  // multiple of 32 so llama.cpp's converter can write Q8_0 / Q4_0 / MXFP4 for every 2-D weight.
  if (name == "k3-micro" || name == "k3-micro-bf16" || name == "kimi-linear-micro") {
    s.hidden = 64, s.layers = 5, s.intermediate = 128;
    s.head_dim = 64;
    s.full_attn_layers = {3, 5};
    s.attn_res_block = 2;
    s.experts = 8, s.top_k = 2, s.shared = 1, s.moe_inter = 32, s.latent = 32;
    s.q_lora = 32, s.kv_lora = 64, s.nope = 64, s.rope = 32, s.v_dim = 64;
    s.shards = 1;
    s.mxfp4_experts = name == "k3-micro";
    if (name == "kimi-linear-micro") {
      s.arch = "kimi_linear";
      s.q_lora = 0;
      s.routed_scaling = 2.446f;
      s.pad_a_log = false;
    }
    return s;
  }
  if (name == "k3-tiny-dsa") {  // layers 4 and 8 sparse (top-16 of the context), layer 9 dense
    s.sparse_attn_layers = {4, 8};
    s.index_heads = 4, s.index_topk = 16;
    return s;
  }
  if (name == "k3-bench" || name == "k3-bench-dsa") {  // K3 per-layer structure, widths cut to fit a 24 GiB / 2-core box
    s.vocab = 32768, s.hidden = 2048, s.layers = 8, s.intermediate = 8192;
    s.mla_heads = 16, s.kda_heads = 16;
    s.full_attn_layers = {4, 8};
    s.attn_res_block = 4;
    s.experts = 64, s.top_k = 8, s.shared = 2, s.moe_inter = 1024, s.latent = 1024;
    s.q_lora = 768;
    s.shards = 4;
    if (name == "k3-bench-dsa") {  // V3.2 ratios: index heads = half the attention heads, top-2048
      s.sparse_attn_layers = {4, 8};
      s.index_heads = 8, s.index_topk = 2048;
    }
    return s;
  }
  // Real per-layer widths, fewer layers and experts (issue 5 "Measure", bench/llama_cpp_compare.py): the
  // weights are far above the 32 MiB LLC but the whole model stays a few GB. Vocab cut to 32768 (the
  // embedding and lm_head are not per-layer widths; 163840 would make lm_head dominate the active bytes).
  if (name == "kimi-linear-bench") {  // Kimi-Linear-48B-A3B layer shapes (docs/model-math.md §3.8), one 3:1 period
    s.arch = "kimi_linear";
    s.vocab = 32768, s.hidden = 2304, s.layers = 4, s.intermediate = 9216;
    s.mla_heads = 32, s.kda_heads = 32, s.head_dim = 128;
    s.full_attn_layers = {4};
    s.q_lora = 0, s.kv_lora = 512, s.nope = 128, s.rope = 64, s.v_dim = 128;
    s.experts = 64, s.top_k = 8, s.shared = 1, s.moe_inter = 1024;  // release: 256 experts top-8
    s.mxfp4_experts = false;
    s.routed_scaling = 2.446f;
    s.pad_a_log = false;
    s.shards = 4;
    return s;
  }
  if (name == "k3-shape-bench") {  // K3 layer shapes (docs/model-math.md §1.3): layer 0 KDA + dense, layer 1 MLA + LatentMoE
    s.vocab = 32768, s.hidden = 7168, s.layers = 2, s.intermediate = 33792;
    s.mla_heads = 96, s.kda_heads = 96, s.head_dim = 128;
    s.full_attn_layers = {2};
    s.attn_res_block = 1;  // release: 12; here every layer writes a bank row (two blocks, as AttnRes needs ≥ 2)
    s.experts = 32, s.top_k = 8, s.shared = 2, s.moe_inter = 3072, s.latent = 3584;  // release: 896 experts top-16
    s.q_lora = 1536, s.kv_lora = 512, s.nope = 128, s.rope = 64, s.v_dim = 128;
    s.shards = 4;
    return s;
  }
  if (name == "k3-default") {  // the embedded default: K3 architecture; 256 byte ranks + K3's 256 specials
    s.vocab = 512, s.hidden = 256, s.layers = 9;
    s.shards = 2;
    return s;
  }
  if (name == "deepseek-v2style-tiny") {  // deepseek_v3-typed, V2-Lite-like: no q_lora, softmax routing
    s.arch = "deepseek_v3";
    s.vocab = 512, s.hidden = 256, s.layers = 4, s.intermediate = 384;
    s.mla_heads = 4, s.q_lora = 0, s.kv_lora = 192, s.nope = 64, s.rope = 32, s.v_dim = 64;
    s.experts = 16, s.top_k = 4, s.shared = 2, s.moe_inter = 96, s.routed_scaling = 16.0f;
    s.first_k_dense = 1, s.n_group = 4, s.topk_group = 2;
    s.topk_method = "group_limited_greedy", s.norm_topk_prob = false;
    s.mxfp4_experts = false, s.fp8 = false;
    return s;
  }
  if (name == "deepseek-v3-micro-bf16") {  // DeepSeek V3 structure at micro widths, BF16: the deepseek2 GGUF tests
    // (q_lora, YaRN, noaux_tc with groups, a shared expert, one dense first layer; every matrix input
    // width a multiple of 32, incl. the converter's k_b [nope] and v_b [kv_lora] halves).
    s.arch = "deepseek_v3";
    s.hidden = 64, s.layers = 4, s.intermediate = 128;
    s.mla_heads = 2, s.q_lora = 32, s.kv_lora = 64, s.nope = 32, s.rope = 32, s.v_dim = 32;
    s.experts = 8, s.top_k = 2, s.shared = 1, s.moe_inter = 32, s.routed_scaling = 2.5f;
    s.first_k_dense = 1, s.n_group = 4, s.topk_group = 2;
    s.mxfp4_experts = false, s.fp8 = false, s.shards = 1;
    return s;
  }
  if (name == "deepseek-v2-lite-micro-bf16") {  // DeepSeek-V2-Lite structure at micro widths, BF16: the V2-Lite
    // deepseek2 GGUF tests. 27 layers as the release (1 dense + 26 MoE): llama.cpp reads a file without
    // q_lora_rank only at V2-Lite's layer counts. No q_lora, softmax top-k greedy (one group), 2 shared
    // experts, no renormalization, YaRN with V2-Lite's values (docs/model-math.md §5.5); every matrix input
    // width a multiple of 32.
    s.arch = "deepseek_v3";
    s.hidden = 32, s.layers = 27, s.intermediate = 128;
    s.mla_heads = 2, s.q_lora = 0, s.kv_lora = 64, s.nope = 32, s.rope = 32, s.v_dim = 32;
    s.experts = 8, s.top_k = 3, s.shared = 2, s.moe_inter = 32, s.routed_scaling = 1.0f;
    s.first_k_dense = 1, s.n_group = 1, s.topk_group = 1;
    s.topk_method = "greedy", s.norm_topk_prob = false;
    s.yarn_mscale = 0.707, s.yarn_mscale_all_dim = 0.707;
    s.mxfp4_experts = false, s.fp8 = false, s.shards = 1;
    return s;
  }
  if (name == "deepseek2-lite-bench") {  // DeepSeek-V2-Lite layer widths and depth (docs/model-math.md §5.5):
    // 27 layers (1 dense + 26 MoE), 16 routed experts instead of 64 (top-6 kept), vocab 32768, BF16: the
    // ik_llama.cpp / llama.cpp side-by-side benchmark. The 27 layers are what lets ik_llama.cpp load it: it takes
    // a deepseek2 file for V2-Lite (no q_lora) by its 26 / 27 layers alone. config.json also says q_lora_rank 0
    // (not null) so llama.cpp's converter writes the key.
    s.arch = "deepseek_v3";
    s.vocab = 32768, s.hidden = 2048, s.layers = 27, s.intermediate = 10944;
    s.mla_heads = 16, s.q_lora = 0, s.kv_lora = 512, s.nope = 128, s.rope = 64, s.v_dim = 128;
    s.experts = 16, s.top_k = 6, s.shared = 2, s.moe_inter = 1408, s.routed_scaling = 1.0f;
    s.first_k_dense = 1, s.n_group = 1, s.topk_group = 1;
    s.topk_method = "greedy", s.norm_topk_prob = false;
    s.yarn_mscale = 0.707, s.yarn_mscale_all_dim = 0.707;
    s.q_lora_zero_key = true;
    s.mxfp4_experts = false, s.fp8 = false, s.shards = 4;
    return s;
  }
  if (name == "deepseek-v3-tiny" || name == "deepseek-v32-tiny" || name == "deepseek-v32-sparse-tiny") {
    // Every width off the 128 grid somewhere (partial FP8 blocks): q_lora 160, kv_a rows 192+32,
    // intermediate 384 = 3 blocks, moe_inter 96.
    s.arch = "deepseek_v3";
    s.vocab = 512, s.hidden = 256, s.layers = 4, s.intermediate = 384;
    s.mla_heads = 4, s.q_lora = 160, s.kv_lora = 192, s.nope = 64, s.rope = 32, s.v_dim = 64;
    s.experts = 16, s.top_k = 4, s.shared = 1, s.moe_inter = 96, s.routed_scaling = 2.5f;
    s.first_k_dense = 2, s.n_group = 4, s.topk_group = 2;
    s.mxfp4_experts = false, s.fp8 = true, s.mtp_layers = 1;
    if (name != "deepseek-v3-tiny") {  // different routing shape; index_topk ≥ every test length
      s.arch = "deepseek_v32";
      s.first_k_dense = 1, s.n_group = 8, s.topk_group = 3, s.mtp_layers = 0;
      // 16 indexer heads: a key scores exactly 0 only if all its head dots are ≤ 0 (ReLU), ~2^-16 — with 4
      // heads (1/16) the top-8 boundary often fell on a tie of zeros, which no reference breaks the same way.
      s.index_heads = 16, s.index_dim = 128, s.index_topk = 256;
      if (name == "deepseek-v32-sparse-tiny") s.index_topk = 8;  // same tensors; sparsity from position 8 on
    }
    return s;
  }
  if (name == "deepseek-bench" || name == "deepseek-bench-dsa") {
    // DeepSeek V3 per-layer structure (FP8 everywhere), widths cut like k3-bench. -dsa: V3.2 (every
    // tensor of deepseek-bench identical, plus an indexer on every layer: 8 heads × 128, top-2048).
    s.arch = name == "deepseek-bench-dsa" ? "deepseek_v32" : "deepseek_v3";
    s.index_heads = 8, s.index_dim = 128, s.index_topk = 2048;
    s.vocab = 32768, s.hidden = 2048, s.layers = 8, s.intermediate = 8192;
    s.mla_heads = 16, s.q_lora = 768, s.kv_lora = 512, s.nope = 128, s.rope = 64, s.v_dim = 128;
    s.experts = 32, s.top_k = 8, s.shared = 1, s.moe_inter = 512, s.routed_scaling = 2.5f;
    s.first_k_dense = 1, s.n_group = 8, s.topk_group = 4;
    s.mxfp4_experts = false, s.fp8 = true, s.shards = 4;
    return s;
  }
  if (name == "qwen3moe-micro-bf16" || name == "qwen3moe-bench") {  // Qwen3-MoE (docs/model-math.md §11)
    s.arch = "qwen3_moe";
    s.rope_theta = 1000000.0, s.norm_topk_prob = true;
    s.mxfp4_experts = false, s.fp8 = false;
    if (name == "qwen3moe-micro-bf16") {  // every matrix input width a multiple of 32 (Q8_0 / Q4_0 conversions)
      s.hidden = 64, s.layers = 4, s.intermediate = 128;
      s.mla_heads = 4, s.kv_heads = 2, s.head_dim = 32;
      s.experts = 8, s.top_k = 2, s.moe_inter = 32;
      s.shards = 1;
    } else {  // Qwen3-30B-A3B widths: 32 query / 4 KV heads of 128, 128 experts top-8 of 768
      s.vocab = 32768, s.hidden = 2048, s.layers = 8, s.intermediate = 6144;
      s.mla_heads = 32, s.kv_heads = 4, s.head_dim = 128;
      s.experts = 128, s.top_k = 8, s.moe_inter = 768;
      s.shards = 4;
    }
    return s;
  }
  if (name == "gptoss-bench") {  // gpt-oss-20b widths (docs/model-math.md §12): 64 query / 8 KV heads of 64,
    s.arch = "gpt_oss";            // 32 experts top-4 of 2880, window 128 on the even layers
    s.mxfp4_experts = false, s.fp8 = false;
    s.vocab = 32768, s.hidden = 2880, s.layers = 4;
    s.mla_heads = 64, s.kv_heads = 8, s.head_dim = 64;
    s.experts = 32, s.top_k = 4, s.moe_inter = 2880, s.sliding_window = 128;
    s.shards = 4;
    return s;
  }
  return invalid_argument("unknown model preset '" + name + "'");
}

Status generate_checkpoint(const GenSpec& s, const std::string& dir, Progress* progress) {
  if (s.arch == "deepseek_v3" || s.arch == "deepseek_v32") return generate_deepseek_checkpoint(s, dir, progress);
  if (s.arch == "qwen3_moe") return generate_qwen3_moe_checkpoint(s, dir, progress);
  if (s.arch == "gpt_oss") return generate_gpt_oss_checkpoint(s, dir, progress);
  if (s.arch != "kimi_k3" && s.arch != "kimi_linear") return invalid_argument("arch must be kimi_k3 or kimi_linear");
  if ((s.arch == "kimi_k3" ? s.latent : s.hidden) % 32 != 0 || s.moe_inter % 32 != 0)
    if (s.mxfp4_experts) return invalid_argument("MXFP4 experts need dims that are multiples of 32");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create: " + ec.message());
  const bool k3 = s.arch == "kimi_k3";
  const std::string root = std::string(k3 ? "language_model." : "") + "model.";
  Writer w(s, progress);
  w.bf16(root + "embed_tokens.weight", {s.vocab, s.hidden}, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = root + "layers." + std::to_string(l) + ".";
    w.norm(p + "input_layernorm.weight", s.hidden);
    w.norm(p + "post_attention_layernorm.weight", s.hidden);
    if (k3) {
      w.norm(p + "self_attention_res_norm.weight", s.hidden);
      w.bf16(p + "self_attention_res_proj.weight", {1, s.hidden}, 2.0f / std::sqrt(static_cast<float>(s.hidden)));
      w.norm(p + "mlp_res_norm.weight", s.hidden);
      w.bf16(p + "mlp_res_proj.weight", {1, s.hidden}, 2.0f / std::sqrt(static_cast<float>(s.hidden)));
    }
    if (is_mla(s, l)) write_mla(w, s, p + "self_attn.");
    else write_kda(w, s, p + "self_attn.");
    if (is_sparse(s, l)) write_indexer(w, s, p + "self_attn.indexer.");
    if (l == 0) {
      w.linear(p + "mlp.gate_proj", s.intermediate, s.hidden);
      w.linear(p + "mlp.up_proj", s.intermediate, s.hidden);
      w.linear(p + "mlp.down_proj", s.hidden, s.intermediate);
    } else {
      write_moe(w, s, p + "block_sparse_moe.");
    }
  }
  w.norm(root + "norm.weight", s.hidden);
  if (k3) {
    w.norm(root + "output_attn_res_norm.weight", s.hidden);
    w.bf16(root + "output_attn_res_proj.weight", {1, s.hidden}, 2.0f / std::sqrt(static_cast<float>(s.hidden)));
  }
  w.linear(std::string(k3 ? "language_model." : "") + "lm_head", s.vocab, s.hidden);
  const json vision = k3 ? vision_config(s) : json();
  if (k3) KESTREL_RETURN_IF_ERROR(write_vision(w, vision));

  KESTREL_RETURN_IF_ERROR(gen_detail::write_shards(w.tensors, s.shards, dir, progress));

  json cfg;
  if (k3) {
    cfg = {{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"},
           {"bos_token_id", s.vocab - 256}, {"eos_token_id", s.vocab - 254}, {"pad_token_id", s.vocab - 1},
           {"media_placeholder_token_id", s.vocab - 256 + 21},
           {"tie_word_embeddings", false}, {"dtype", "bfloat16"}, {"text_config", text_config(s)},
           {"vision_config", vision}};
  } else {
    cfg = text_config(s);
    cfg["architectures"] = {"KimiLinearForCausalLM"};
  }
  std::ofstream(fs::path(dir) / "config.json") << cfg.dump(2) << "\n";
  return Status::ok();
}

}  // namespace kestrel
