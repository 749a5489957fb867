#include "models/gqa_moe_model.h"

#include <filesystem>

#include "base/check.h"
#include "kernels/cpu/elementwise.h"
#include "loader/gguf_config.h"

namespace kestrel {

Result<std::unique_ptr<GqaMoeModel>> GqaMoeModel::load(const std::string& dir, ExpertShard* shard) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir, ec)) {
    if (shard != nullptr && shard->size > 1)
      return unsupported(dir + ": expert parallelism needs a safetensors checkpoint (a GGUF file stacks a layer's "
                               "experts in one tensor)");
    return load_gguf(dir);
  }
  auto cfg = load_model_config(dir);
  if (!cfg) return cfg.error();
  if (cfg->arch == Arch::kGptOss)
    return unsupported(dir + ": gpt-oss safetensors checkpoints (experts fused as gate_up_proj) are not loaded yet; "
                             "convert the checkpoint to GGUF with llama.cpp's converter and load that file");
  if (cfg->arch != Arch::kQwen3Moe) return invalid_argument(dir + ": model_type '" + cfg->model_type + "' is not qwen3_moe");
  auto ck = Checkpoint::open(dir);
  if (!ck) return ck.error();
  auto m = std::unique_ptr<GqaMoeModel>(new GqaMoeModel());
  m->cfg_ = std::move(*cfg);
  m->ckpt_ = std::make_unique<Checkpoint>(std::move(*ck));
  KESTREL_RETURN_IF_ERROR(bind_whole_checkpoint(*m->ckpt_, dir, m->cfg_.model_type, shard, 0,
                                                [&](Binder& b) { return m->bind(b); }));
  m->bound_weight_bytes_ = m->ckpt_->bound_bytes();
  return m;
}

Result<std::unique_ptr<GqaMoeModel>> GqaMoeModel::load_gguf(const std::string& path) {
  auto g = GgufWeights::open(path);
  if (!g) return g.error();
  auto cfg = model_config_from_gguf((*g)->file().header(), path);
  if (!cfg) return cfg.error();
  if (cfg->arch != Arch::kQwen3Moe && cfg->arch != Arch::kGptOss)
    return invalid_argument(path + ": not a qwen3moe or gpt-oss GGUF file");
  auto m = std::unique_ptr<GqaMoeModel>(new GqaMoeModel());
  m->cfg_ = std::move(*cfg);
  m->gguf_ = std::move(*g);
  KESTREL_RETURN_IF_ERROR(bind_whole_gguf(*m->gguf_, path, m->cfg_.model_type, [&](Binder& b) { return m->bind(b); }));
  return m;
}

Status GqaMoeModel::bind(Binder& b) {
  const TextConfig& c = cfg_.text;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  embed_ = b.linear("model.embed_tokens", V, D);
  lm_head_ = c.tie_word_embeddings ? embed_ : b.linear("lm_head", V, D);
  final_norm_ = b.vec("model.norm.weight", {D});
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers && b.ok(); ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.in_norm = b.vec(p + "input_layernorm.weight", {D});
    L.post_norm = b.vec(p + "post_attention_layernorm.weight", {D});
    KESTREL_RETURN_IF_ERROR(L.attn.bind(b, p + "self_attn.", c, l));
    if (c.ffn_kind[static_cast<size_t>(l)] == FfnKind::kDense) {
      L.dense = std::make_unique<GatedMlp>();
      L.dense->bind_dense(b, p + "mlp.", "gate_proj", "up_proj", "down_proj", D, c.intermediate_size, c);
    } else {
      L.moe = std::make_unique<MoeBlock>();
      KESTREL_RETURN_IF_ERROR(L.moe->bind(b, p + "mlp.", c, kHfExpertNames));
    }
  }
  set_geometry(std::vector<bool>(layers_.size(), false));
  return b.status();
}

// Plain pre-norm residual stream: h += GQA(norm h); h += FFN(norm h); logits = lm_head(norm h).
void GqaMoeModel::forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits, const ForwardOptions&) {
  const TextConfig& c = cfg_.text;
  const int64_t T = embed_runs(runs, embed_, h_), D = c.hidden_size, n = T * D;
  normed_.resize(static_cast<size_t>(n));
  sub_.resize(static_cast<size_t>(n));
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    kernels::rms_norm(h_.data(), L.in_norm.data(), T, D, c.rms_norm_eps, normed_.data());
    segs_.clear();
    int64_t off = 0;
    for (const SeqRun& r : runs) segs_.push_back({off, r.T, &r.st->mla[l]}), off += r.T;
    L.attn.forward(normed_.data(), T, segs_, sub_.data());
    add_residual(h_, sub_, n);
    kernels::rms_norm(h_.data(), L.post_norm.data(), T, D, c.rms_norm_eps, normed_.data());
    if (L.dense) L.dense->forward(normed_.data(), T, sub_.data());
    else L.moe->forward(normed_.data(), T, sub_.data());
    add_residual(h_, sub_, n);
  }
  emit_logits(runs, h_.data(), final_norm_.data(), lm_head_, logits);
}

}  // namespace kestrel
