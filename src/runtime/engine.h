// Engine: owns a loaded model and runs sequences: prefill in chunks of any size, decode one token,
// both returning logits. Not thread-safe: one owner thread (the scheduler, or a CLI).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/model.h"

namespace kestrel {

class Engine {
 public:
  // shard: a cell rank's routed experts (load_model()); null binds every expert.
  static Result<std::unique_ptr<Engine>> load(const std::string& dir, ExpertShard* shard = nullptr);
  const ModelConfig& config() const { return model_->config(); }
  SequenceState new_sequence(KvCacheDtype kv = KvCacheDtype::kF32) const { return model_->new_sequence(kv); }

  // Feeds ids in chunks of `chunk` tokens (0 = one chunk). Returns the last token's logits, or all
  // tokens' logits when `all_logits` ([n, vocab]).
  Result<std::vector<float>> prefill(SequenceState& seq, std::span<const int32_t> ids, int64_t chunk = 0,
                                     bool all_logits = false, const ForwardOptions& base = {});
  // The same with image embeddings media [rows, hidden] (encode_images) written at the prompt's <|media_pad|>
  // positions in order; the number of pads in ids must equal the number of rows.
  Result<std::vector<float>> prefill_media(SequenceState& seq, std::span<const int32_t> ids,
                                           std::span<const float> media, int64_t chunk = 0, bool all_logits = false,
                                           const ForwardOptions& base = {});
  // One request's images through the model's vision tower and projector, as one batch: [sum of tokens, hidden].
  // `stop` is asked between the tower's blocks: true ends it with kUnavailable; `times`, when set, gets each stage's
  // seconds added.
  Result<std::vector<float>> encode_images(std::span<const VisionImage> images, const StopFn& stop = {},
                                           VisionStageTimes* times = nullptr) const {
    return model_->encode_images(images, stop, times);
  }
  bool has_vision() const { return model_->has_vision(); }
  Result<std::vector<float>> decode(SequenceState& seq, int32_t id, const ForwardOptions& base = {});
  // Allocation-free form for steady-state decode: `logits` is reused.
  Status decode_into(SequenceState& seq, int32_t id, std::vector<float>& logits, const ForwardOptions& base = {});
  void reserve(SequenceState& seq, int64_t n_tokens) const { model_->reserve(seq, n_tokens); }
  Model& model() { return *model_; }
  const std::vector<std::string>& load_notes() const { return model_->load_notes(); }

 private:
  Status check_ids(std::span<const int32_t> ids) const;
  std::unique_ptr<Model> model_;
};

}  // namespace kestrel
