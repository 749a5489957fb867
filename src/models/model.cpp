#include "models/model.h"

#include <cstring>
#include <filesystem>

#include "base/check.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"
#include "loader/gguf.h"
#include "models/deepseek_model.h"
#include "models/kimi_model.h"
#include "models/gqa_moe_model.h"

namespace kestrel {

CacheGeometry cache_geometry_of(const TextConfig& c, const std::vector<bool>& is_kda) {
  CacheGeometry g;
  for (size_t l = 0; l < is_kda.size(); ++l) {
    (is_kda[l] ? g.kda_layers : g.mla_layers).push_back(static_cast<int>(l));
    if (!is_kda[l] && l < c.attn_sparse.size() && c.attn_sparse[l]) g.sparse_layers.push_back(static_cast<int>(l));
  }
  g.index_row_bytes = g.sparse_layers.empty() ? 0 : kernels::indexer_row_bytes(c.index_head_dim);
  if (!g.kda_layers.empty()) {
    g.kda_conv_floats = KdaState::conv_floats(c);
    g.kda_recurrent_floats = KdaState::recurrent_floats(c);
  }
  // Paged rows: MLA latents [c_kv | k_r], or GQA keys and values [k | v] of every KV head (no positional part).
  const bool gqa = !c.attn_kind.empty() && c.attn_kind.front() == AttnKind::kGqa;
  g.mla_row_floats = gqa ? c.gqa_row_floats() : c.kv_lora_rank + c.qk_rope_head_dim;
  g.mla_rope = gqa ? 0 : c.qk_rope_head_dim;
  return g;
}

CacheGeometry cache_geometry_of(const ModelConfig& cfg) {
  const TextConfig& c = cfg.text;
  std::vector<bool> is_kda(static_cast<size_t>(c.num_hidden_layers), false);
  for (size_t l = 0; l < is_kda.size() && l < c.attn_kind.size(); ++l) is_kda[l] = c.attn_kind[l] == AttnKind::kKda;
  return cache_geometry_of(c, is_kda);
}

void Model::set_geometry(const std::vector<bool>& is_kda) {
  num_layers_ = is_kda.size();
  geom_ = cache_geometry_of(cfg_.text, is_kda);
}

SequenceState Model::new_sequence(KvCacheDtype kv) const {
  const CacheGeometry& g = geom_;
  SequenceState s;
  s.owns_storage = true;
  s.kda.resize(num_layers_);
  s.mla.resize(num_layers_);
  s.own_state.assign(static_cast<size_t>(g.slot_floats()), 0.0f);
  float* p = s.own_state.data();
  for (int l : g.kda_layers) {
    s.kda[static_cast<size_t>(l)].conv = p;
    p += g.kda_conv_floats;
    s.kda[static_cast<size_t>(l)].recurrent = p;
    p += g.kda_recurrent_floats;
  }
  for (int l : g.mla_layers) {
    s.mla[static_cast<size_t>(l)].page_tokens = kOwnPageTokens;
    s.mla[static_cast<size_t>(l)].row = g.mla_row(kv);
  }
  for (int l : g.sparse_layers) s.mla[static_cast<size_t>(l)].indexer.page_tokens = kOwnPageTokens;
  return s;
}

void Model::reserve(SequenceState& st, int64_t n_tokens) const {
  KCHECK(st.owns_storage, "reserve() is for standalone sequences; pool-backed ones get pages from cache/");
  const CacheGeometry& g = geom_;
  for (int l : g.mla_layers) {
    MlaCache& m = st.mla[static_cast<size_t>(l)];
    while (m.capacity() < n_tokens) {
      st.own_pages.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(kOwnPageTokens * m.row.bytes())));
      m.pages.push_back(st.own_pages.back().get());
    }
  }
  for (int l : g.sparse_layers) {
    IndexerCache& ic = st.mla[static_cast<size_t>(l)].indexer;
    while (ic.capacity() < n_tokens) {
      st.own_index_pages.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(kOwnPageTokens * g.index_row_bytes)));
      ic.pages.push_back(st.own_index_pages.back().get());
    }
  }
}

void Model::fill_synthetic_context(SequenceState& st, int64_t n, uint64_t seed) const {
  KCHECK(st.owns_storage && st.n_tokens == 0, "synthetic context needs a fresh standalone sequence");
  reserve(st, n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  auto uni = [&x] {  // xorshift64*: uniform in [-1, 1)
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    return static_cast<float>(static_cast<double>((x * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-52 - 1.0);
  };
  const CacheGeometry& g = geom_;
  std::vector<float> row(static_cast<size_t>(g.mla_row_floats));
  for (int l : g.mla_layers) {
    MlaCache& m = st.mla[static_cast<size_t>(l)];
    for (int64_t j = 0; j < n; ++j) {
      for (auto& v : row) v = uni();
      kernels::kv_store_row(m.row, row.data(), m.row_ptr(j));
    }
    m.n_tokens = n;
  }
  std::vector<float> k;
  for (int l : g.sparse_layers) {
    IndexerCache& ic = st.mla[static_cast<size_t>(l)].indexer;
    const int64_t D = cfg_.text.index_head_dim;
    k.resize(static_cast<size_t>(D));
    for (int64_t j = 0; j < n; ++j) {
      for (auto& v : k) v = uni();
      uint8_t* r = ic.pages[static_cast<size_t>(j / ic.page_tokens)] + (j % ic.page_tokens) * g.index_row_bytes;
      const float s = kernels::quantize_e4m3_block(k.data(), D, true, r);
      std::memcpy(r + D, &s, 4);
    }
    ic.n_tokens = n;
  }
  st.n_tokens = n;
}

int64_t Model::embed_runs(std::span<const SeqRun> runs, const kernels::WeightMatrix& embed, std::vector<float>& h) {
  const TextConfig& c = cfg_.text;
  const int64_t D = c.hidden_size;
  int64_t T = 0;
  for (const SeqRun& r : runs) {
    if (r.st->owns_storage) reserve(*r.st, r.st->n_tokens + r.T);
    T += r.T;
  }
  h.resize(static_cast<size_t>(T * D));
  int64_t t = 0;
  for (const SeqRun& r : runs)
    for (int64_t i = 0; i < r.T; ++i, ++t) {
      KCHECK(r.ids[i] >= 0 && r.ids[i] < c.vocab_size, "token id out of range (callers validate)");
      kernels::decode_row(embed, r.ids[i], h.data() + t * D);
    }
  return T;
}

void Model::add_residual(std::vector<float>& h, const std::vector<float>& sub, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] += sub[static_cast<size_t>(i)];
}

void Model::emit_logits(std::span<const SeqRun> runs, const float* h, const float* final_norm,
                        const kernels::WeightMatrix& lm_head, std::vector<float>& logits) {
  const TextConfig& c = cfg_.text;
  const int64_t D = c.hidden_size;
  head_rows_.clear();
  int64_t off = 0;
  for (const SeqRun& r : runs) {
    for (int64_t i = r.all_logits ? 0 : r.T - 1; i < r.T; ++i) head_rows_.push_back(off + i);
    off += r.T;
    r.st->n_tokens += r.T;
  }
  const int64_t n = static_cast<int64_t>(head_rows_.size());
  head_in_.resize(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i)
    kernels::rms_norm(h + head_rows_[static_cast<size_t>(i)] * D, final_norm, 1, D, c.rms_norm_eps, head_in_.data() + i * D);
  logits.resize(static_cast<size_t>(n * c.vocab_size));
  kernels::matmul(lm_head, head_in_.data(), n, logits.data());
}

void Model::forward(const int32_t* ids, int64_t T, SequenceState& st, std::vector<float>& logits,
                        const ForwardOptions& o, const float* media, int64_t media_rows) {
  one_.assign(1, SeqRun{ids, T, &st, o.all_logits, media, media_rows});
  forward_batch(one_, logits, o);
}

Result<std::vector<float>> Model::encode_images(std::span<const VisionImage>, const StopFn&, VisionStageTimes*) const {
  return unsupported(cfg_.model_type + " model without a vision tower: image input is not supported");
}

namespace {
// general.architecture of a GGUF file (the header only; the model then maps the file itself).
Result<std::string> gguf_architecture(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f) return f.error();
  const GgufValue* v = f->header().find("general.architecture");
  const auto a = v ? v->as_string() : std::nullopt;
  if (!a) return invalid_argument(path + ": key 'general.architecture': missing or not a string");
  return *a;
}
}  // namespace

Result<std::unique_ptr<Model>> load_model(const std::string& dir, ExpertShard* shard) {

  std::error_code ec;
  if (std::filesystem::is_regular_file(dir, ec)) {  // a GGUF file (kimi-k3 / kimi-linear / deepseek2 / qwen3moe / gpt-oss)
    if (shard != nullptr && shard->size > 1)
      return unsupported(dir + ": expert parallelism needs a safetensors checkpoint (a GGUF file stacks a layer's "
                               "experts in one tensor)");
    auto arch = gguf_architecture(dir);
    if (!arch) return arch.error();
    if (*arch == "deepseek2") {
      auto m = DeepseekModel::load_gguf(dir);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
    if (*arch == "qwen3moe" || *arch == "gpt-oss") {
      auto m = GqaMoeModel::load_gguf(dir);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
    auto m = KimiModel::load(dir);
    if (!m) return m.error();
    return std::unique_ptr<Model>(std::move(*m));
  }
  auto cfg = load_model_config(dir);
  if (!cfg) return cfg.error();
  switch (cfg->arch) {
    case Arch::kKimiK3:
    case Arch::kKimiLinear: {
      auto m = KimiModel::load(dir, shard);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
    case Arch::kDeepseekV3:
    case Arch::kDeepseekV32: {
      auto m = DeepseekModel::load(dir, shard);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
    case Arch::kQwen3Moe:
    case Arch::kGptOss: {
      auto m = GqaMoeModel::load(dir, shard);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
  }
  return unsupported(dir + ": no model for this architecture");
}

}  // namespace kestrel
