#include "models/kimi_model.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/elementwise.h"
#include "layers/attn_res.h"
#include "loader/gguf_config.h"
#include "loader/vision_config.h"

namespace kestrel {

namespace {
std::vector<float> fold(const std::vector<float>& norm_w, const std::vector<float>& proj_w) {
  std::vector<float> c(norm_w.size());
  for (size_t i = 0; i < c.size() && i < proj_w.size(); ++i) c[i] = norm_w[i] * proj_w[i];
  return c;
}
}  // namespace

Result<std::unique_ptr<KimiModel>> KimiModel::load(const std::string& dir, ExpertShard* shard) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir, ec)) return load_gguf(dir);
  auto cfg = load_model_config(dir);
  if (!cfg) return cfg.error();
  if (cfg->arch != Arch::kKimiK3 && cfg->arch != Arch::kKimiLinear)
    return invalid_argument(dir + ": model_type '" + cfg->model_type + "' is not a Kimi K3 / Kimi Linear model");
  auto ck = Checkpoint::open(dir);
  if (!ck) return ck.error();
  auto m = std::unique_ptr<KimiModel>(new KimiModel());
  m->cfg_ = std::move(*cfg);
  m->ckpt_ = std::make_unique<Checkpoint>(std::move(*ck));
  KESTREL_RETURN_IF_ERROR(bind_whole_checkpoint(*m->ckpt_, dir, m->cfg_.model_type, shard, m->cfg_.text.int4_group_size,
                                                [&](Binder& b) { return m->bind_checkpoint(b, dir); }));
  return m;
}

// The text model, then (K3) the released vision tower and projector.
Status KimiModel::bind_checkpoint(Binder& b, const std::string& dir) {
  KESTREL_RETURN_IF_ERROR(bind(b));
  bound_weight_bytes_ = ckpt_->bound_bytes();
  if (cfg_.arch == Arch::kKimiK3) {
    // The released K3 checkpoint carries the vision tower and projector: the layout is checked against
    // vision_config (one clear error per wrong tensor), then every tensor is bound by its released name.
    auto vision = check_vision_tensors(*ckpt_, cfg_.vision_config_json, cfg_.text.hidden_size);
    if (!vision) return vision.error();
    if (vision->tensors > 0) {
      auto vc = parse_vision_config(cfg_.vision_config_json, dir + "/config.json");
      if (!vc) return vc.error();
      if (cfg_.media_pad_id < 0)
        return invalid_argument(dir + "/config.json: a vision tower but no media_placeholder_token_id or bos_token_id");
      vision_tower_ = std::make_unique<VisionTower>();
      KESTREL_RETURN_IF_ERROR(vision_tower_->bind(b, *vc));
      KESTREL_RETURN_IF_ERROR(vision_projector_.bind(b, *vc));
      char note[256];
      std::snprintf(note, sizeof note, "vision tower + projector: %lld tensors, %.2f M params, loaded (image input)",
                    static_cast<long long>(vision->tensors), static_cast<double>(vision->params) / 1e6);
      load_notes_.push_back(note);
    }
  }
  return Status::ok();
}

Result<std::vector<float>> KimiModel::encode_images(std::span<const VisionImage> images, const StopFn& stop,
                                                    VisionStageTimes* times) const {
  if (!vision_tower_) return Model::encode_images(images, stop, times);
  auto merged = vision_tower_->forward(images, stop, times);
  if (!merged) return merged.error();
  std::vector<float> out;
  const auto t0 = std::chrono::steady_clock::now();
  vision_projector_.forward(merged->data(), static_cast<int64_t>(merged->size()) / vision_projector_.in_width(), out);
  if (times) times->projector += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<std::unique_ptr<KimiModel>> KimiModel::load_gguf(const std::string& path) {
  auto g = GgufWeights::open(path);
  if (!g) return g.error();
  auto cfg = model_config_from_gguf((*g)->file().header(), path);
  if (!cfg) return cfg.error();
  auto m = std::unique_ptr<KimiModel>(new KimiModel());
  m->cfg_ = std::move(*cfg);
  m->gguf_ = std::move(*g);
  KESTREL_RETURN_IF_ERROR(bind_whole_gguf(*m->gguf_, path, m->cfg_.model_type, [&](Binder& b) { return m->bind(b); }));
  return m;
}

Status KimiModel::bind(Binder& b) {
  const TextConfig& c = cfg_.text;
  const bool k3 = cfg_.arch == Arch::kKimiK3;
  const std::string root = cfg_.weight_prefix + "model.";
  const int64_t D = c.hidden_size, V = c.vocab_size;
  if (k3 && c.num_hidden_layers / c.attn_res_block_size + 2 > 64)
    return unsupported("attn_res_block_size too small: more than 64 residual sources");
  embed_ = b.linear(root + "embed_tokens", V, D);
  lm_head_ = c.tie_word_embeddings ? embed_ : b.linear(cfg_.lm_head_name.substr(0, cfg_.lm_head_name.size() - 7), V, D);
  final_norm_ = b.vec(root + "norm.weight", {D});
  if (k3) out_res_c_ = fold(b.vec(root + "output_attn_res_norm.weight", {D}),
                            b.vec(root + "output_attn_res_proj.weight", {1, D}));
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers && b.ok(); ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = root + "layers." + std::to_string(l) + ".";
    L.in_norm = b.vec(p + "input_layernorm.weight", {D});
    L.post_norm = b.vec(p + "post_attention_layernorm.weight", {D});
    if (k3) {
      L.attn_res_c = fold(b.vec(p + "self_attention_res_norm.weight", {D}), b.vec(p + "self_attention_res_proj.weight", {1, D}));
      L.mlp_res_c = fold(b.vec(p + "mlp_res_norm.weight", {D}), b.vec(p + "mlp_res_proj.weight", {1, D}));
    }
    if (c.attn_kind[static_cast<size_t>(l)] == AttnKind::kKda) {
      L.kda = std::make_unique<KdaLayer>();
      KESTREL_RETURN_IF_ERROR(L.kda->bind(b, p + "self_attn.", c));
    } else {
      L.mla = std::make_unique<MlaLayer>();
      KESTREL_RETURN_IF_ERROR(L.mla->bind(b, p + "self_attn.", c, c.attn_sparse[static_cast<size_t>(l)]));
    }
    if (c.ffn_kind[static_cast<size_t>(l)] == FfnKind::kDense) {
      L.dense = std::make_unique<GatedMlp>();
      L.dense->bind_dense(b, p + "mlp.", "gate_proj", "up_proj", "down_proj", D, c.intermediate_size, c);
    } else {
      L.moe = std::make_unique<MoeBlock>();
      KESTREL_RETURN_IF_ERROR(L.moe->bind(b, p + "block_sparse_moe.", c));
    }
  }
  std::vector<bool> is_kda;
  for (const Layer& L : layers_) is_kda.push_back(L.kda != nullptr);
  set_geometry(is_kda);
  return b.status();
}

double KimiModel::indexer_seconds() const {
  double s = 0;
  for (const Layer& L : layers_)
    if (L.mla && L.mla->indexer()) s += L.mla->indexer()->seconds();
  return s;
}

std::span<const int32_t> KimiModel::last_topk(size_t layer) const {
  return layer < layers_.size() && layers_[layer].mla ? layers_[layer].mla->last_topk() : std::span<const int32_t>{};
}

void KimiModel::run_attn(size_t l, const float* x, int64_t T, float* out, const ForwardOptions& o) {
  const TextConfig& c = cfg_.text;
  normed_.resize(static_cast<size_t>(T * c.hidden_size));
  kernels::rms_norm(x, layers_[l].in_norm.data(), T, c.hidden_size, c.rms_norm_eps, normed_.data());
  if (layers_[l].kda) {
    kda_segs_.clear();
    int64_t off = 0;
    for (const SeqRun& r : runs_) kda_segs_.push_back({off, r.T, &r.st->kda[l]}), off += r.T;
    layers_[l].kda->forward(normed_.data(), T, kda_segs_, out, o.kda_force_recurrent);
  } else {
    mla_segs_.clear();
    int64_t off = 0;
    for (const SeqRun& r : runs_) mla_segs_.push_back({off, r.T, &r.st->mla[l]}), off += r.T;
    layers_[l].mla->forward(normed_.data(), T, mla_segs_, out, o.mla_mode);
  }
}

void KimiModel::run_ffn(size_t l, const float* x, int64_t T, float* out) {
  const TextConfig& c = cfg_.text;
  normed_.resize(static_cast<size_t>(T * c.hidden_size));
  kernels::rms_norm(x, layers_[l].post_norm.data(), T, c.hidden_size, c.rms_norm_eps, normed_.data());
  if (layers_[l].dense) layers_[l].dense->forward(normed_.data(), T, out);
  else layers_[l].moe->forward(normed_.data(), T, out);
}

void KimiModel::forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits, const ForwardOptions& o) {
  const TextConfig& c = cfg_.text;
  const int64_t D = c.hidden_size;
  int64_t T = 0;
  for (const SeqRun& r : runs) {
    if (r.st->owns_storage) reserve(*r.st, r.st->n_tokens + r.T);
    T += r.T;
  }
  runs_ = runs;
  h_.resize(static_cast<size_t>(T * D));
  int64_t t = 0;
  for (const SeqRun& r : runs) {
    const float* media = r.media;
    int64_t rows_left = media != nullptr ? r.media_rows : 0;
    for (int64_t i = 0; i < r.T; ++i, ++t) {
      KCHECK(r.ids[i] >= 0 && r.ids[i] < c.vocab_size, "token id out of range (callers validate)");
      if (rows_left > 0 && r.ids[i] == cfg_.media_pad_id) {  // image embedding at its <|media_pad|>
        std::copy(media, media + D, h_.data() + t * D);
        media += D;
        --rows_left;
      } else {
        kernels::decode_row(embed_, r.ids[i], h_.data() + t * D);
      }
    }
  }
  if (cfg_.arch == Arch::kKimiK3) forward_k3(T, o);
  else forward_linear(T, o);
  // h_ now holds the pre-final-norm stream; gather the rows that need logits.
  emit_logits(runs, h_.data(), final_norm_.data(), lm_head_, logits);
  runs_ = {};
}

// Plain pre-norm residual stream: h += Attn(norm h); h += FFN(norm h).
void KimiModel::forward_linear(int64_t T, const ForwardOptions& o) {
  const int64_t n = T * cfg_.text.hidden_size;
  sub_.resize(static_cast<size_t>(n));
  for (size_t l = 0; l < layers_.size(); ++l) {
    run_attn(l, h_.data(), T, sub_.data(), o);
    for (int64_t i = 0; i < n; ++i) h_[static_cast<size_t>(i)] += sub_[static_cast<size_t>(i)];
    run_ffn(l, h_.data(), T, sub_.data());
    for (int64_t i = 0; i < n; ++i) h_[static_cast<size_t>(i)] += sub_[static_cast<size_t>(i)];
  }
}

// Block Attention Residuals (docs/model-math.md §2.1). h_ holds the running block sum ("prefix");
// bank_ the frozen block sums. On return h_ holds the final AttnRes mixture.
void KimiModel::forward_k3(int64_t T, const ForwardOptions& o) {
  const TextConfig& c = cfg_.text;
  const int64_t D = c.hidden_size, n = T * D;
  const float eps = c.rms_norm_eps;
  size_t banked = 0;
  bank_.resize(static_cast<size_t>(c.num_hidden_layers / c.attn_res_block_size + 1));
  sub_.resize(static_cast<size_t>(n));
  mix_.resize(static_cast<size_t>(n));
  std::vector<const float*>& rows = rows_;
  auto mix = [&](const std::vector<float>& cw, bool with_prefix) {
    rows.clear();
    for (size_t j = 0; j < banked; ++j) rows.push_back(bank_[j].data());
    if (with_prefix) rows.push_back(h_.data());
    attn_res_mix(rows, T, D, cw.data(), eps, mix_.data());
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    bool have_prefix = true;
    const float* a_in = h_.data();
    if (banked > 0) {
      mix(L.attn_res_c, true);
      a_in = mix_.data();
    }
    if (static_cast<int>(l) % c.attn_res_block_size == 0) {
      bank_[banked].assign(h_.begin(), h_.begin() + n);
      ++banked;
      have_prefix = false;
      if (a_in == h_.data()) {  // bank was empty: a_in is the prefix itself; keep a copy to read
        mix_.assign(h_.begin(), h_.begin() + n);
        a_in = mix_.data();
      }
    }
    run_attn(l, a_in, T, sub_.data(), o);
    if (have_prefix)
      for (int64_t i = 0; i < n; ++i) h_[static_cast<size_t>(i)] += sub_[static_cast<size_t>(i)];
    else
      std::copy_n(sub_.begin(), n, h_.begin());
    mix(L.mlp_res_c, true);
    run_ffn(l, mix_.data(), T, sub_.data());
    for (int64_t i = 0; i < n; ++i) h_[static_cast<size_t>(i)] += sub_[static_cast<size_t>(i)];
  }
  mix(out_res_c_, true);
  std::copy_n(mix_.begin(), n, h_.begin());
}

}  // namespace kestrel
