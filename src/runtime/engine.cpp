#include "runtime/engine.h"

#include <algorithm>

namespace kestrel {

Result<std::unique_ptr<Engine>> Engine::load(const std::string& dir, ExpertShard* shard) {
  auto m = load_model(dir, shard);
  if (!m) return m.error();
  auto e = std::make_unique<Engine>();
  e->model_ = std::move(*m);
  return e;
}

Status Engine::check_ids(std::span<const int32_t> ids) const {
  const int vocab = config().text.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                              " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
  return Status::ok();
}

Result<std::vector<float>> Engine::prefill(SequenceState& seq, std::span<const int32_t> ids, int64_t chunk,
                                           bool all_logits, const ForwardOptions& base) {
  return prefill_media(seq, ids, {}, chunk, all_logits, base);
}

Result<std::vector<float>> Engine::prefill_media(SequenceState& seq, std::span<const int32_t> ids,
                                                 std::span<const float> media, int64_t chunk, bool all_logits,
                                                 const ForwardOptions& base) {
  if (ids.empty()) return invalid_argument("prefill needs at least one token");
  KESTREL_RETURN_IF_ERROR(check_ids(ids));
  const int64_t n = static_cast<int64_t>(ids.size()), D = config().text.hidden_size;
  const int32_t pad = config().media_pad_id;
  if (!media.empty()) {
    if (!model_->has_vision()) return unsupported("image embeddings given to a model without a vision tower");
    const int64_t pads = std::count(ids.begin(), ids.end(), pad);
    if (static_cast<int64_t>(media.size()) % D != 0 || static_cast<int64_t>(media.size()) / D != pads)
      return invalid_argument(
          "the prompt has " + std::to_string(pads) + " <|media_pad|> positions (id " + std::to_string(pad) +
          ") but the images give " +
          (static_cast<int64_t>(media.size()) % D == 0
               ? std::to_string(static_cast<int64_t>(media.size()) / D) + " embedding rows"
               : std::to_string(media.size()) + " values (not whole rows of " + std::to_string(D) + ")"));
  }
  if (chunk <= 0) chunk = n;
  std::vector<float> out, part;
  ForwardOptions o = base;
  o.all_logits = all_logits;
  const float* rows = media.empty() ? nullptr : media.data();
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t T = std::min(chunk, n - s);
    const int64_t pads = rows != nullptr ? std::count(ids.begin() + s, ids.begin() + s + T, pad) : 0;
    model_->forward(ids.data() + s, T, seq, part, o, rows, pads);
    if (rows != nullptr) rows += pads * D;
    if (all_logits) out.insert(out.end(), part.begin(), part.end());
  }
  return all_logits ? out : part;
}

Result<std::vector<float>> Engine::decode(SequenceState& seq, int32_t id, const ForwardOptions& base) {
  std::vector<float> logits;
  KESTREL_RETURN_IF_ERROR(decode_into(seq, id, logits, base));
  return logits;
}

Status Engine::decode_into(SequenceState& seq, int32_t id, std::vector<float>& logits, const ForwardOptions& base) {
  KESTREL_RETURN_IF_ERROR(check_ids(std::span<const int32_t>(&id, 1)));
  ForwardOptions o = base;
  o.all_logits = false;
  model_->forward(&id, 1, seq, logits, o);
  return Status::ok();
}

}  // namespace kestrel
