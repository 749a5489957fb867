#include "models/model.h"

#include "base/check.h"
#include "models/deepseek_model.h"
#include "models/kimi_model.h"

namespace kestrel {

void Model::set_geometry(const std::vector<bool>& is_kda) {
  const TextConfig& c = cfg_.text;
  num_layers_ = is_kda.size();
  CacheGeometry& g = geom_;
  g = CacheGeometry{};
  for (size_t l = 0; l < is_kda.size(); ++l) (is_kda[l] ? g.kda_layers : g.mla_layers).push_back(static_cast<int>(l));
  if (!g.kda_layers.empty()) {
    g.kda_conv_floats = KdaState::conv_floats(c);
    g.kda_recurrent_floats = KdaState::recurrent_floats(c);
  }
  g.mla_row_floats = c.kv_lora_rank + c.qk_rope_head_dim;
}

SequenceState Model::new_sequence() const {
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
  for (int l : g.mla_layers) s.mla[static_cast<size_t>(l)].page_tokens = kOwnPageTokens;
  return s;
}

void Model::reserve(SequenceState& st, int64_t n_tokens) const {
  KCHECK(st.owns_storage, "reserve() is for standalone sequences; pool-backed ones get pages from cache/");
  const CacheGeometry& g = geom_;
  const int64_t page_floats = kOwnPageTokens * g.mla_row_floats;
  for (int l : g.mla_layers) {
    MlaCache& m = st.mla[static_cast<size_t>(l)];
    while (m.capacity() < n_tokens) {
      st.own_pages.push_back(std::make_unique<float[]>(static_cast<size_t>(page_floats)));
      m.pages.push_back(st.own_pages.back().get());
    }
  }
}

void Model::forward(const int32_t* ids, int64_t T, SequenceState& st, std::vector<float>& logits,
                        const ForwardOptions& o) {
  one_.assign(1, SeqRun{ids, T, &st, o.all_logits});
  forward_batch(one_, logits, o);
}

Result<std::unique_ptr<Model>> load_model(const std::string& dir) {
  auto cfg = load_model_config(dir);
  if (!cfg) return cfg.error();
  switch (cfg->arch) {
    case Arch::kKimiK3:
    case Arch::kKimiLinear: {
      auto m = KimiModel::load(dir);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
    case Arch::kDeepseekV3:
    case Arch::kDeepseekV32: {
      auto m = DeepseekModel::load(dir);
      if (!m) return m.error();
      return std::unique_ptr<Model>(std::move(*m));
    }
  }
  return unsupported(dir + ": no model for this architecture");
}

}  // namespace kestrel
