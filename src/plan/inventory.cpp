#include "plan/inventory.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace kestrel::plan {
namespace {

using nlohmann::json;

class Builder {
 public:
  explicit Builder(Inventory& inv) : inv_(inv) {}
  void add(std::string name, DType dt, std::vector<int64_t> shape, Component c, Placement p, int layer,
           int64_t copies = 1) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    inv_.tensors.push_back({std::move(name), dt, std::move(shape), c, p, layer, copies, n});
  }
  // PyTorch Linear weight [out, in] in bf16.
  void linear(const std::string& name, int64_t out, int64_t in, Component c, Placement p, int layer) {
    add(name + ".weight", DType::kBF16, {out, in}, c, p, layer);
  }
  void vec(const std::string& name, int64_t n, Component c, Placement p, int layer, DType dt = DType::kBF16) {
    add(name, dt, {n}, c, p, layer);
  }
  // One routed-expert matrix [out, in] in the chosen format, `copies` experts.
  void expert(const std::string& name, int64_t out, int64_t in, int layer, int64_t copies, ExpertFormat f, int group) {
    const Component c = Component::kRoutedExperts;
    const Placement p = Placement::kExpert;
    switch (f) {
      case ExpertFormat::kMxfp4:  // E2M1 codes, two per byte + one E8M0 scale per 32 (docs/model-math.md §1.4)
        add(name + ".weight_packed", DType::kU8, {out, in / 2}, c, p, layer, copies);
        inv_.tensors.back().params = out * in;
        add(name + ".weight_scale", DType::kU8, {out, in / 32}, c, p, layer, copies);
        inv_.tensors.back().params = 0;
        break;
      case ExpertFormat::kW4a8:  // int4, eight per int32 + one bf16 scale per group + the logical shape
        add(name + ".weight_packed", DType::kI32, {out, in / 8}, c, p, layer, copies);
        inv_.tensors.back().params = out * in;
        add(name + ".weight_scale", DType::kBF16, {out, in / group}, c, p, layer, copies);
        inv_.tensors.back().params = 0;
        add(name + ".weight_shape", DType::kI64, {2}, c, p, layer, copies);
        inv_.tensors.back().params = 0;
        break;
      default:
        add(name + ".weight", DType::kBF16, {out, in}, c, p, layer, copies);
        break;
    }
  }

 private:
  Inventory& inv_;
};

void add_kda(Builder& b, const TextConfig& t, bool k3, const std::string& p, int l) {
  const LinearAttnConfig& la = t.linear_attn;
  const int64_t H = la.num_heads, D = la.head_dim, P = H * D, hid = t.hidden_size;
  const auto K = Component::kKda;
  const auto R = Placement::kReplicated, T = Placement::kTensor;
  for (const char* n : {"q_proj", "k_proj", "v_proj"}) b.linear(p + n, P, hid, K, T, l);
  for (const char* n : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"})
    b.add(p + n, DType::kF32, {P, 1, la.short_conv_kernel_size}, K, T, l);
  b.linear(p + "f_a_proj", D, hid, K, R, l);  // rank-D bottleneck input, shared by all heads
  b.linear(p + "f_b_proj", P, D, K, T, l);
  b.linear(p + "b_proj", H, hid, K, T, l);
  b.vec(p + "dt_bias", P, K, T, l, DType::kF32);
  // A_log is per head: K3 stores [head_dim] padded past H, Kimi Linear [1,1,H,1] (kda_layer.cpp).
  if (k3) b.add(p + "A_log", DType::kF32, {std::max(D, H)}, K, T, l);
  else b.add(p + "A_log", DType::kF32, {1, 1, H, 1}, K, T, l);
  b.vec(p + "o_norm.weight", D, K, R, l, DType::kF32);
  if (la.use_full_rank_gate) {
    b.linear(p + "g_proj", P, hid, K, T, l);
  } else {
    b.linear(p + "g_a_proj", D, hid, K, R, l);
    b.linear(p + "g_b_proj", P, D, K, T, l);
  }
  b.linear(p + "o_proj", hid, P, K, T, l);
}

void add_mla(Builder& b, const TextConfig& t, const std::string& p, int l) {
  const int64_t nh = t.num_attention_heads, hid = t.hidden_size, qk = t.qk_head_dim();
  const auto M = Component::kMla;
  const auto R = Placement::kReplicated, T = Placement::kTensor;
  if (t.q_lora_rank > 0) {
    b.linear(p + "q_a_proj", t.q_lora_rank, hid, M, R, l);
    b.vec(p + "q_a_layernorm.weight", t.q_lora_rank, Component::kNorms, R, l);
    b.linear(p + "q_b_proj", nh * qk, t.q_lora_rank, M, T, l);
  } else {
    b.linear(p + "q_proj", nh * qk, hid, M, T, l);
  }
  b.linear(p + "kv_a_proj_with_mqa", t.kv_lora_rank + t.qk_rope_head_dim, hid, M, R, l);
  b.vec(p + "kv_a_layernorm.weight", t.kv_lora_rank, Component::kNorms, R, l);
  b.linear(p + "kv_b_proj", nh * (t.qk_nope_head_dim + t.v_head_dim), t.kv_lora_rank, M, T, l);
  if (t.mla_use_output_gate) b.linear(p + "g_proj", nh * t.v_head_dim, hid, M, T, l);
  b.linear(p + "o_proj", hid, nh * t.v_head_dim, M, T, l);
}

// Grouped-query attention (Qwen3-MoE, docs/model-math.md §11), counted with the attention projections (kMla).
void add_gqa(Builder& b, const TextConfig& t, const std::string& p, int l) {
  const int64_t hid = t.hidden_size, q = static_cast<int64_t>(t.num_attention_heads) * t.head_dim,
                kv = static_cast<int64_t>(t.num_key_value_heads) * t.head_dim;
  const auto M = Component::kMla;
  const auto R = Placement::kReplicated, T = Placement::kTensor;
  b.linear(p + "q_proj", q, hid, M, T, l);
  b.linear(p + "k_proj", kv, hid, M, T, l);
  b.linear(p + "v_proj", kv, hid, M, T, l);
  b.linear(p + "o_proj", hid, q, M, T, l);
  if (t.qk_norm) {
    b.vec(p + "q_norm.weight", t.head_dim, Component::kNorms, R, l);
    b.vec(p + "k_norm.weight", t.head_dim, Component::kNorms, R, l);
  }
}

// DeepSeek-V3.2 indexer tensors (docs/model-math.md §6.2), counted bf16 and replicated under TP
// (the reference builds them as plain Linear layers). The query reads the MLA q latent when there is one.
void add_indexer(Builder& b, const TextConfig& t, const std::string& p, int l) {
  const int64_t nih = t.index_n_heads, d = t.index_head_dim, hid = t.hidden_size;
  const auto I = Component::kIndexer;
  const auto R = Placement::kReplicated;
  b.linear(p + "wq_b", nih * d, t.q_lora_rank > 0 ? t.q_lora_rank : hid, I, R, l);
  b.linear(p + "wk", d, hid, I, R, l);
  b.vec(p + "k_norm.weight", d, I, R, l);
  b.vec(p + "k_norm.bias", d, I, R, l);
  b.linear(p + "weights_proj", nih, hid, I, R, l);
}

void add_moe(Builder& b, const TextConfig& t, const std::string& p, int l, ExpertFormat f, int group) {
  const int64_t hid = t.hidden_size, E = t.num_experts, in = t.latent_moe() ? t.routed_expert_hidden_size : hid;
  const auto R = Placement::kReplicated, T = Placement::kTensor;
  b.linear(p + "gate", E, hid, Component::kRouter, R, l);
  if (t.router_bias) b.vec(p + "gate.e_score_correction_bias", E, Component::kRouter, R, l, DType::kF32);
  if (t.latent_moe()) {  // latent projections stay bf16 and replicated (docs/model-math.md §2.4)
    b.linear(p + "routed_expert_down_proj", in, hid, Component::kLatentProj, R, l);
    if (t.latent_moe_use_norm) b.vec(p + "routed_expert_norm.weight", in, Component::kNorms, R, l);
    b.linear(p + "routed_expert_up_proj", hid, in, Component::kLatentProj, R, l);
  }
  const std::string ep = p + "experts.{e}.";
  b.expert(ep + "w1", t.moe_intermediate_size, in, l, E, f, group);
  b.expert(ep + "w3", t.moe_intermediate_size, in, l, E, f, group);
  b.expert(ep + "w2", in, t.moe_intermediate_size, l, E, f, group);
  if (t.num_shared_experts > 0) {  // fused shared experts, tensor-parallel like a dense MLP
    const int64_t sw = static_cast<int64_t>(t.num_shared_experts) * t.moe_intermediate_size;
    b.linear(p + "shared_experts.gate_proj", sw, hid, Component::kSharedExperts, T, l);
    b.linear(p + "shared_experts.up_proj", sw, hid, Component::kSharedExperts, T, l);
    b.linear(p + "shared_experts.down_proj", hid, sw, Component::kSharedExperts, T, l);
  }
}

// MoonViT3d + PatchMergerMLPV2 (docs/model-math.md §1.3). Counted only when vision_config names every
// width it needs; our generated checkpoints carry a stub vision_config and no vision tensors.
void add_vision(Builder& b, const ModelConfig& cfg, Inventory& inv) {
  if (cfg.vision_config_json.empty()) return void(inv.vision_note = "no vision_config");
  const json v = json::parse(cfg.vision_config_json, nullptr, false);
  const char* keys[] = {"vt_num_hidden_layers", "vt_hidden_size", "vt_intermediate_size", "qkv_hidden_size",
                        "patch_size", "init_pos_emb_height", "init_pos_emb_width", "text_hidden_size"};
  int64_t k[8];
  for (int i = 0; i < 8; ++i) {
    if (!v.is_object() || !v.contains(keys[i]) || !v[keys[i]].is_number_integer() || v[keys[i]].get<int64_t>() < 1 ||
        v[keys[i]].get<int64_t>() > (1 << 20))
      return void(inv.vision_note = std::string("vision_config has no usable '") + keys[i] + "'; vision tower not counted");
  }
  for (int i = 0; i < 8; ++i) k[i] = v[keys[i]].get<int64_t>();
  int64_t merge = 4;
  if (v.contains("merge_kernel_size") && v["merge_kernel_size"].is_array() && v["merge_kernel_size"].size() == 2 &&
      v["merge_kernel_size"][0].is_number_integer() && v["merge_kernel_size"][1].is_number_integer())
    merge = v["merge_kernel_size"][0].get<int64_t>() * v["merge_kernel_size"][1].get<int64_t>();
  if (merge < 1 || merge > 64) return void(inv.vision_note = "vision_config merge_kernel_size out of range");
  const int64_t layers = k[0], hid = k[1], inter = k[2], qkv = k[3], ps = k[4], text = k[7];
  const auto V = Component::kVision;
  const auto R = Placement::kReplicated;
  b.add("vision_tower.patch_embed.proj.weight", DType::kBF16, {hid, 3, ps, ps}, V, R, -1);
  b.add("vision_tower.patch_embed.pos_emb.weight", DType::kBF16, {k[5], k[6], hid}, V, R, -1);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(i) + ".";
    b.vec(p + "norm0.weight", hid, V, R, -1);
    b.vec(p + "norm1.weight", hid, V, R, -1);
    b.linear(p + "wqkv", 3 * qkv, hid, V, R, -1);
    b.linear(p + "wo", hid, qkv, V, R, -1);
    b.linear(p + "mlp.fc0", inter, hid, V, R, -1);
    b.linear(p + "mlp.fc1", hid, inter, V, R, -1);
  }
  b.vec("vision_tower.encoder.final_layernorm.weight", hid, V, R, -1);
  b.linear("mm_projector.proj.0", hid * merge, hid * merge, V, R, -1);
  b.linear("mm_projector.proj.2", text, hid * merge, V, R, -1);
  b.vec("mm_projector.post_norm.weight", text, V, R, -1);
  inv.vision_counted = true;
}

}  // namespace

const char* component_name(Component c) {
  static const char* names[kNumComponents] = {"embedding", "lm_head", "norms", "kda", "mla", "indexer", "dense_mlp",
                                              "router", "latent_proj", "shared_experts", "routed_experts", "vision"};
  return names[static_cast<int>(c)];
}

Result<ExpertFormat> parse_expert_format(const std::string& s) {
  if (s == "checkpoint") return ExpertFormat::kCheckpoint;
  if (s == "mxfp4") return ExpertFormat::kMxfp4;
  if (s == "bf16") return ExpertFormat::kBf16;
  if (s == "w4a8") return ExpertFormat::kW4a8;
  return invalid_argument("expert format '" + s + "' is not one of checkpoint, mxfp4, bf16, w4a8");
}

const char* expert_format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kCheckpoint: return "checkpoint";
    case ExpertFormat::kMxfp4: return "mxfp4";
    case ExpertFormat::kBf16: return "bf16";
    case ExpertFormat::kW4a8: return "w4a8";
  }
  return "?";
}

int64_t TensorEntry::bytes_per_copy() const {
  int64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

Result<Inventory> build_inventory(const ModelConfig& cfg, const InventoryOptions& opt) {
  const TextConfig& t = cfg.text;
  const bool k3 = cfg.arch == Arch::kKimiK3;
  Inventory inv;
  inv.expert_format = opt.experts;
  if (opt.experts == ExpertFormat::kCheckpoint) inv.expert_format = t.experts_mxfp4 ? ExpertFormat::kMxfp4 : ExpertFormat::kBf16;
  const int64_t in = t.latent_moe() ? t.routed_expert_hidden_size : t.hidden_size;
  if (inv.expert_format == ExpertFormat::kMxfp4 && (in % 32 != 0 || t.moe_intermediate_size % 32 != 0))
    return invalid_argument("MXFP4 experts need input widths that are multiples of 32");
  if (inv.expert_format == ExpertFormat::kW4a8) {
    const int g = opt.w4a8_group_size;
    if (g < 8 || g % 8 != 0 || in % g != 0 || t.moe_intermediate_size % g != 0)
      return invalid_argument("W4A8 group size " + std::to_string(g) +
                              " must be a multiple of 8 dividing the expert input widths (" + std::to_string(in) +
                              ", " + std::to_string(t.moe_intermediate_size) + ")");
  }
  Builder b(inv);
  const std::string root = cfg.weight_prefix + "model.";
  const auto R = Placement::kReplicated, T = Placement::kTensor;
  const int64_t H = t.hidden_size, V = t.vocab_size;
  b.linear(root + "embed_tokens", V, H, Component::kEmbedding, T, -1);  // vocab-parallel
  std::vector<bool> sparse(static_cast<size_t>(t.num_hidden_layers), false);
  for (int l : t.sparse_attn_layers) sparse[static_cast<size_t>(l)] = true;
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    const std::string p = root + "layers." + std::to_string(l) + ".";
    b.vec(p + "input_layernorm.weight", H, Component::kNorms, R, l);
    b.vec(p + "post_attention_layernorm.weight", H, Component::kNorms, R, l);
    if (k3) {  // Block AttnRes pseudo-queries (norm weight + [1, H] projection) before attention and MLP
      for (const char* s : {"self_attention_res", "mlp_res"}) {
        b.vec(p + s + "_norm.weight", H, Component::kNorms, R, l);
        b.add(p + s + "_proj.weight", DType::kBF16, {1, H}, Component::kNorms, R, l);
      }
    }
    switch (t.attn_kind[static_cast<size_t>(l)]) {
      case AttnKind::kMla: add_mla(b, t, p + "self_attn.", l); break;
      case AttnKind::kGqa: add_gqa(b, t, p + "self_attn.", l); break;
      case AttnKind::kKda: add_kda(b, t, k3, p + "self_attn.", l); break;
    }
    if (sparse[static_cast<size_t>(l)]) add_indexer(b, t, p + "self_attn.indexer.", l);
    if (t.ffn_kind[static_cast<size_t>(l)] == FfnKind::kDense) {
      b.linear(p + "mlp.gate_proj", t.intermediate_size, H, Component::kDenseMlp, T, l);
      b.linear(p + "mlp.up_proj", t.intermediate_size, H, Component::kDenseMlp, T, l);
      b.linear(p + "mlp.down_proj", H, t.intermediate_size, Component::kDenseMlp, T, l);
    } else {
      add_moe(b, t, p + "block_sparse_moe.", l, inv.expert_format, opt.w4a8_group_size);
    }
  }
  b.vec(root + "norm.weight", H, Component::kNorms, R, -1);
  if (k3) {
    b.vec(root + "output_attn_res_norm.weight", H, Component::kNorms, R, -1);
    b.add(root + "output_attn_res_proj.weight", DType::kBF16, {1, H}, Component::kNorms, R, -1);
  }
  if (!t.tie_word_embeddings)
    b.linear(cfg.lm_head_name.substr(0, cfg.lm_head_name.size() - 7), V, H, Component::kLmHead, T, -1);
  if (k3) add_vision(b, cfg, inv);
  return inv;
}

}  // namespace kestrel::plan
