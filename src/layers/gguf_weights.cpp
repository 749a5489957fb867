#include "layers/gguf_weights.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"

namespace kestrel {
namespace {

// HF → GGUF renames. Names are relative to "model.layers.L." (per layer) or the model root.
struct Rename {
  const char* hf;
  const char* gguf;
};
constexpr Rename kLayerRenames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    // KDA
    {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
    {"self_attn.q_conv1d.weight", "ssm_conv1d_q.weight"}, {"self_attn.k_conv1d.weight", "ssm_conv1d_k.weight"},
    {"self_attn.v_conv1d.weight", "ssm_conv1d_v.weight"},
    {"self_attn.f_a_proj", "ssm_f_a"}, {"self_attn.f_b_proj", "ssm_f_b"}, {"self_attn.b_proj", "ssm_beta"},
    {"self_attn.dt_bias", "ssm_dt.bias"}, {"self_attn.o_norm.weight", "ssm_norm.weight"},
    {"self_attn.g_a_proj", "ssm_g_a"}, {"self_attn.g_b_proj", "ssm_g_b"},
    {"self_attn.o_proj", "attn_output"},
    // MLA (q_proj of Kimi Linear's MLA is attn_q as above; g_proj is resolved by layer type below)
    {"self_attn.q_a_proj", "attn_q_a"}, {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj", "attn_q_b"}, {"self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    // GQA (qwen3moe): q/k/v/o as above, plus the per-head norms
    {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    // gpt-oss: q/k/v/o biases, the per-head sinks, the router's bias and the experts' biases stacked [E, n]
    {"self_attn.q_proj.bias", "attn_q.bias"}, {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"}, {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.sinks", "attn_sinks.weight"}, {"mlp.gate.bias", "ffn_gate_inp.bias"},
    {"mlp.experts.gate_proj_bias", "ffn_gate_exps.bias"}, {"mlp.experts.up_proj_bias", "ffn_up_exps.bias"},
    {"mlp.experts.down_proj_bias", "ffn_down_exps.bias"},
    // dense MLP
    {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"}, {"mlp.down_proj", "ffn_down"},
    // MoE
    {"block_sparse_moe.gate", "ffn_gate_inp"}, {"block_sparse_moe.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"block_sparse_moe.routed_expert_down_proj", "ffn_routed_down"},
    {"block_sparse_moe.routed_expert_up_proj", "ffn_routed_up"},
    {"block_sparse_moe.routed_expert_norm.weight", "ffn_routed_norm.weight"},
    {"block_sparse_moe.shared_experts.gate_proj", "ffn_gate_shexp"},
    {"block_sparse_moe.shared_experts.up_proj", "ffn_up_shexp"},
    {"block_sparse_moe.shared_experts.down_proj", "ffn_down_shexp"},
    // DeepSeek V3 / Kimi K2 MoE (deepseek2): the same tensors under "mlp."
    {"mlp.gate", "ffn_gate_inp"}, {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"mlp.shared_experts.gate_proj", "ffn_gate_shexp"}, {"mlp.shared_experts.up_proj", "ffn_up_shexp"},
    {"mlp.shared_experts.down_proj", "ffn_down_shexp"},
};
constexpr Rename kRootRenames[] = {
    {"model.embed_tokens", "token_embd"}, {"lm_head", "output"}, {"model.norm.weight", "output_norm.weight"}};

enum class Kind { kPlain, kExpert, kResNorm, kResProj, kALog, kConv, kKvB, kGProj };

// An HF name resolved to a GGUF tensor and the transform between them.
struct Mapped {
  std::string gguf;    // tensor name (for kKvB: the layer prefix "blk.L.")
  Kind kind = Kind::kPlain;
  int64_t expert = 0;  // kExpert
};

bool consume(std::string& s, std::string_view prefix) {
  if (s.rfind(prefix, 0) != 0) return false;
  s.erase(0, prefix.size());
  return true;
}

// Suffix after `base` for linear lookups: the Binder asks for "<x>" (linear) or "<x>.weight".
std::optional<Mapped> map_name(std::string n) {
  consume(n, "language_model.");
  for (const Rename& r : kRootRenames)
    if (n == r.hf) return Mapped{r.gguf};
  if (n == "model.output_attn_res_norm.weight") return Mapped{"output_res_score.weight", Kind::kResNorm};
  if (n == "model.output_attn_res_proj.weight") return Mapped{"output_res_score.weight", Kind::kResProj};
  if (!consume(n, "model.layers.")) return std::nullopt;
  const size_t dot = n.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 6) return std::nullopt;
  for (size_t i = 0; i < dot; ++i)
    if (n[i] < '0' || n[i] > '9') return std::nullopt;
  const std::string blk = "blk." + n.substr(0, dot) + ".";
  n.erase(0, dot + 1);
  for (const Rename& r : kLayerRenames)
    if (n == r.hf) return Mapped{blk + r.gguf, n.find("conv1d") != std::string::npos ? Kind::kConv : Kind::kPlain};
  if (n == "self_attention_res_norm.weight") return Mapped{blk + "attn_res_score.weight", Kind::kResNorm};
  if (n == "self_attention_res_proj.weight") return Mapped{blk + "attn_res_score.weight", Kind::kResProj};
  if (n == "mlp_res_norm.weight") return Mapped{blk + "ffn_res_score.weight", Kind::kResNorm};
  if (n == "mlp_res_proj.weight") return Mapped{blk + "ffn_res_score.weight", Kind::kResProj};
  if (n == "self_attn.A_log") return Mapped{blk + "ssm_a", Kind::kALog};
  if (n == "self_attn.kv_b_proj") return Mapped{blk, Kind::kKvB};
  if (n == "self_attn.g_proj") return Mapped{blk, Kind::kGProj};
  if (consume(n, "block_sparse_moe.experts.") || consume(n, "mlp.experts.")) {
    const size_t d = n.find('.');
    if (d == std::string::npos || d == 0 || d > 6) return std::nullopt;
    int64_t e = 0;
    for (size_t i = 0; i < d; ++i) {
      if (n[i] < '0' || n[i] > '9') return std::nullopt;
      e = e * 10 + (n[i] - '0');
    }
    const std::string w = n.substr(d + 1);
    const char* t = w == "w1" || w == "gate_proj" ? "ffn_gate_exps.weight"
                    : w == "w3" || w == "up_proj" ? "ffn_up_exps.weight"
                    : w == "w2" || w == "down_proj" ? "ffn_down_exps.weight" : nullptr;
    if (t == nullptr) return std::nullopt;
    return Mapped{blk + t, Kind::kExpert, e};
  }
  return std::nullopt;
}

std::string ne_str(const std::vector<int64_t>& ne) {
  std::string s = "ne [";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::optional<kernels::WeightFormat> format_of(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return kernels::WeightFormat::kF32;
    case GgmlType::kF16: return kernels::WeightFormat::kF16;
    case GgmlType::kBF16: return kernels::WeightFormat::kBF16;
    case GgmlType::kQ8_0: return kernels::WeightFormat::kGgufQ8_0;
    case GgmlType::kQ4_0: return kernels::WeightFormat::kGgufQ4_0;
    case GgmlType::kMXFP4: return kernels::WeightFormat::kGgufMxfp4;
    default: return std::nullopt;
  }
}

std::optional<DType> dtype_of(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

}  // namespace

Result<std::unique_ptr<GgufWeights>> GgufWeights::open(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f) return f.error();
  return std::make_unique<GgufWeights>(std::move(*f));
}

Status GgufWeights::error(const std::string& gguf_name, const std::string& what) const {
  return corrupt(path() + ": tensor '" + gguf_name + "': " + what);
}

const GgufTensorInfo* GgufWeights::find(const std::string& gguf_name) {
  const GgufTensorInfo* t = file_.header().tensor(gguf_name);
  if (t != nullptr && used_.insert(gguf_name).second && progress_) {
    progress_->advance(t->nbytes);
    if (used_.size() == file_.header().tensors.size()) progress_.reset();
  }
  return t;
}

void GgufWeights::show_progress(const std::string& label) {
  uint64_t bytes = 0;
  for (const auto& t : file_.header().tensors) bytes += t.nbytes;
  progress_ = std::make_unique<Progress>(label, bytes, file_.header().tensors.size());
}

// A [out, in] matrix view starting at row `row0` of tensor t (rows of ne[0] = in elements).
Result<kernels::WeightMatrix> GgufWeights::matrix(const GgufTensorInfo& t, int64_t out, int64_t in, int64_t row0,
                                                  bool pack) {
  const auto f = format_of(t.type);
  const auto tr = ggml_type_traits(static_cast<uint32_t>(t.type));
  if (!f) return unsupported(path() + ": tensor '" + t.name + "': ggml type " + std::string(tr->name) +
                             " is not supported (F32, F16, BF16, Q8_0, Q4_0, MXFP4 are)");
  const int64_t row_bytes = in / tr->block * tr->block_bytes;
  const uint8_t* p = file_.data(t) + row0 * row_bytes;
  const int64_t elem = tr->block == 1 ? tr->block_bytes : 1;
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(elem) != 0)
    return error(t.name, "data not aligned to its element size (general.alignment " +
                             std::to_string(file_.header().alignment) + ")");
  kernels::WeightMatrix w;
  w.format = *f;
  w.out = out;
  w.in = in;
  w.data = p;
  w.act_bf16 = w.format == kernels::WeightFormat::kBF16;
  if (pack && kernels::x16_format(w.format)) {
    // Q4_0 and MXFP4: the int8 products read only the packed copy; the ggml rows stay mapped for the exact
    // path (decoded on demand), their pages dropped so that the copy does not double the resident weights.
    w.packed = packed_
                   .emplace_back(w.format == kernels::WeightFormat::kGgufQ4_0 ? kernels::pack_q4_0_x16(w)
                                                                               : kernels::pack_mxfp4_x16(w))
                   .data();
    file_.drop_pages(p, static_cast<size_t>(out * row_bytes));
  }
  return w;
}

Result<kernels::WeightMatrix> GgufWeights::merged_kv_b(const std::string& blk, int64_t out, int64_t in) {
  const GgufTensorInfo* kb = find(blk + "attn_k_b.weight");
  const GgufTensorInfo* vb = find(blk + "attn_v_b.weight");
  if (kb == nullptr || vb == nullptr) return not_found(path() + ": tensor '" + blk + "attn_k_b.weight' / 'attn_v_b.weight' not found");
  // k_b ne [dn, lora, H]; v_b ne [lora, dv, H]; kv_b rows per head h: dn key rows then dv value rows.
  if (kb->ne.size() != 3 || vb->ne.size() != 3 || kb->ne[1] != in || vb->ne[0] != in || kb->ne[2] != vb->ne[2] ||
      kb->ne[2] * (kb->ne[0] + vb->ne[1]) != out)
    return error(kb->name, ne_str(kb->ne) + " / " + ne_str(vb->ne) + " do not split kv_b_proj [" + std::to_string(out) +
                               ", " + std::to_string(in) + "]");
  const int64_t H = kb->ne[2], dn = kb->ne[0], dv = vb->ne[1], lora = in;
  // The split point must be the config's (key_length_mla − rope = qk_nope): equal sums could hide a swap.
  const GgufHeader& h = file_.header();
  const GgufValue* arch = h.find("general.architecture");
  const std::string a = arch && arch->as_string() ? *arch->as_string() : "";
  const GgufValue* kl = h.find(a + ".attention.key_length_mla");
  const GgufValue* rd = h.find(a + ".rope.dimension_count");
  if (!kl || !rd || !kl->as_int() || !rd->as_int() || *kl->as_int() - *rd->as_int() != dn)
    return error(kb->name, ne_str(kb->ne) + ": ne[0] is not qk_nope_head_dim (key_length_mla − rope.dimension_count)");
  auto k = matrix(*kb, H * lora, dn, 0, /*pack=*/false);  // only decoded here
  if (!k) return k.error();
  auto v = matrix(*vb, H * dv, lora, 0, /*pack=*/false);
  if (!v) return v.error();
  std::vector<float>& m = owned_.emplace_back(static_cast<size_t>(out * lora));
  std::vector<float> row(static_cast<size_t>(std::max(dn, lora)));
  for (int64_t h = 0; h < H; ++h) {
    float* head = m.data() + h * (dn + dv) * lora;
    for (int64_t c = 0; c < lora; ++c) {  // k_b row (h, c) is column c of the head's dn key rows
      kernels::decode_row(*k, h * lora + c, row.data());
      for (int64_t i = 0; i < dn; ++i) head[i * lora + c] = row[static_cast<size_t>(i)];
    }
    for (int64_t j = 0; j < dv; ++j) kernels::decode_row(*v, h * dv + j, head + (dn + j) * lora);
  }
  kernels::WeightMatrix w;
  w.format = kernels::WeightFormat::kF32;
  w.out = out;
  w.in = in;
  w.data = m.data();
  return w;
}

std::optional<std::pair<kernels::WeightMatrix, kernels::WeightMatrix>> GgufWeights::split_kv_b(
    const std::string& hf_kv_b, int64_t heads, int64_t dn, int64_t dv, int64_t lora) {
  auto mp = map_name(hf_kv_b);
  if (!mp || mp->kind != Kind::kKvB) return std::nullopt;
  const GgufTensorInfo* kb = file_.header().tensor(mp->gguf + "attn_k_b.weight");
  const GgufTensorInfo* vb = file_.header().tensor(mp->gguf + "attn_v_b.weight");
  if (kb == nullptr || vb == nullptr) return std::nullopt;
  const std::vector<int64_t> kne{dn, lora, heads}, vne{lora, dv, heads};
  if (kb->ne != kne || vb->ne != vne) return std::nullopt;  // linear(kv_b_proj) reports the mismatch
  auto k = matrix(*kb, heads * lora, dn, 0);
  auto v = matrix(*vb, heads * dv, lora, 0);
  if (!k || !v) return std::nullopt;
  return std::make_pair(*k, *v);
}

Result<kernels::WeightMatrix> GgufWeights::linear(const std::string& hf_name, int64_t out, int64_t in) {
  auto mp = map_name(hf_name);
  if (!mp) return not_found(path() + ": no GGUF tensor corresponds to '" + hf_name + "'");
  if (mp->kind == Kind::kKvB) return merged_kv_b(mp->gguf, out, in);
  if (mp->kind == Kind::kGProj) {  // KDA full-rank gate or MLA output gate: one HF name, two GGUF names
    const std::string kda = mp->gguf + "ssm_g.weight";
    mp->gguf = file_.header().tensor(kda) ? kda : mp->gguf + "attn_gate.weight";
  } else if (mp->kind == Kind::kPlain) {
    mp->gguf += ".weight";
  } else if (mp->kind != Kind::kExpert) {
    return not_found(path() + ": '" + hf_name + "' is not a linear weight");
  }
  const GgufTensorInfo* t = find(mp->gguf);
  if (t == nullptr) return not_found(path() + ": tensor '" + mp->gguf + "' (for '" + hf_name + "') not found");
  if (mp->kind == Kind::kExpert) {
    if (t->ne.size() != 3 || t->ne[0] != in || t->ne[1] != out || mp->expert >= t->ne[2])
      return error(t->name, ne_str(t->ne) + ", expected [" + std::to_string(in) + ", " + std::to_string(out) +
                                ", > " + std::to_string(mp->expert) + "] for expert " + std::to_string(mp->expert));
    return matrix(*t, out, in, mp->expert * out);
  }
  if (t->ne.size() != 2 || t->ne[0] != in || t->ne[1] != out)
    return error(t->name, ne_str(t->ne) + ", expected ne [" + std::to_string(in) + ", " + std::to_string(out) + "]");
  return matrix(*t, out, in, 0);
}

Result<TensorView> GgufWeights::float_view(const GgufTensorInfo& t, std::vector<int64_t> shape) {
  const auto dt = dtype_of(t.type);
  if (!dt) return unsupported(path() + ": tensor '" + t.name + "': ggml type " +
                              std::string(ggml_type_traits(static_cast<uint32_t>(t.type))->name) +
                              " where a float tensor (F32/F16/BF16) is needed");
  const uint8_t* p = file_.data(t);
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(dtype_size(*dt)) != 0)
    return error(t.name, "data not aligned to its element size");
  return TensorView{p, *dt, std::move(shape)};
}

Result<TensorView> GgufWeights::get(const std::string& hf_name, const std::vector<int64_t>& shape) {
  auto mp = map_name(hf_name);
  if (!mp || mp->kind == Kind::kExpert || mp->kind == Kind::kKvB || mp->kind == Kind::kGProj)
    return not_found(path() + ": no GGUF float tensor corresponds to '" + hf_name + "'");
  const GgufTensorInfo* t = find(mp->gguf);
  // gpt-oss's converter writes the post-attention norm as post_attention_norm, the others as ffn_norm.
  const std::string ffn_norm = "ffn_norm.weight";
  if (t == nullptr && mp->gguf.size() > ffn_norm.size() &&
      mp->gguf.compare(mp->gguf.size() - ffn_norm.size(), ffn_norm.size(), ffn_norm) == 0) {
    const std::string alt = mp->gguf.substr(0, mp->gguf.size() - ffn_norm.size()) + "post_attention_norm.weight";
    if (file_.header().tensor(alt) != nullptr) t = find(mp->gguf = alt);
  }
  if (t == nullptr) return not_found(path() + ": tensor '" + mp->gguf + "' (for '" + hf_name + "') not found");
  std::vector<int64_t> have = t->shape();
  auto check = [&](const std::vector<int64_t>& s) -> Status {
    if (!shape.empty() && s != shape)
      return error(t->name, "presents '" + hf_name + "' as " + shape_str(s) + ", expected " + shape_str(shape));
    return Status::ok();
  };
  if (mp->kind == Kind::kConv) {  // ne [W, 1, P, 1] → HF [P, 1, W] (same bytes); quantize drops the last 1
    if (t->ne.size() < 3 || t->ne[1] != 1 || (t->ne.size() == 4 && t->ne[3] != 1))
      return error(t->name, ne_str(t->ne) + ", expected [W, 1, P, 1]");
    have = {t->ne[2], 1, t->ne[0]};
  }
  if (mp->kind == Kind::kResProj) {  // the score already holds norm ⊙ proj: proj becomes ones [1, D]
    std::vector<float>& ones = owned_.emplace_back(static_cast<size_t>(t->numel()), 1.0f);
    KESTREL_RETURN_IF_ERROR(check({1, t->numel()}));
    return TensorView{ones.data(), DType::kF32, {1, t->numel()}};
  }
  // Per-head / per-channel vectors are presented flat (the converter writes A_log as [1, H, 1, 1]
  // or [H]; llama.cpp's quantize drops trailing 1-dims).
  if (mp->kind == Kind::kResNorm || mp->kind == Kind::kALog) have = {t->numel()};
  auto v = float_view(*t, have);
  if (!v) return v.error();
  if (mp->kind == Kind::kALog) {  // the file holds −exp(A_log) in f32
    std::vector<float>& a = owned_.emplace_back(to_f32(*v));
    for (float& x : a) {
      if (!(x < 0.0f)) return error(t->name, "−exp(A_log) must be negative, found " + std::to_string(x));
      x = std::log(-x);
    }
    v = TensorView{a.data(), DType::kF32, have};
  }
  KESTREL_RETURN_IF_ERROR(check(v->shape));
  return v;
}

std::vector<std::string> GgufWeights::unused() const {
  std::vector<std::string> out;
  for (const auto& t : file_.header().tensors)
    if (!used_.count(t.name)) out.push_back(t.name);
  return out;
}

}  // namespace kestrel
