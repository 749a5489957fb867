// The model interface the runtime drives (Engine, scheduler, bench) and the per-sequence state every
// model shares. One implementation per architecture family: KimiModel (K3, Kimi Linear) and
// DeepseekModel (DeepSeek V3 / Kimi K2 / V3.2). load_model() picks one from config.json.
// Thread-safety: forward_batch() is not reentrant (one caller at a time); OpenMP parallelises inside.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "layers/expert_shard.h"
#include "layers/kda_layer.h"
#include "layers/mla_layer.h"
#include "layers/vision_tower.h"
#include "loader/model_config.h"

namespace kestrel {

// Everything one sequence carries between forward calls: views of its KDA state (per KDA layer) and
// MLA pages (per MLA layer). Storage is either owned here (standalone sequences: CLI, tests) or lent
// by the cache pools (server); see cache/.
struct SequenceState {
  std::vector<KdaState> kda;  // indexed by layer (null views for MLA layers)
  std::vector<MlaCache> mla;  // indexed by layer (no pages for KDA layers)
  int64_t n_tokens = 0;
  // Owned storage (standalone sequences only).
  std::vector<float> own_state;
  std::vector<std::unique_ptr<uint8_t[]>> own_pages;  // MLA latent pages (in the sequence's cache dtype)
  std::vector<std::unique_ptr<uint8_t[]>> own_index_pages;  // DSA indexer key pages
  bool owns_storage = false;

  SequenceState() = default;
  SequenceState(SequenceState&&) = default;  // views stay valid: buffers move, not copy
  SequenceState& operator=(SequenceState&&) = default;
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;
};

// One sequence's share of a batched forward.
struct SeqRun {
  const int32_t* ids = nullptr;
  int64_t T = 0;
  SequenceState* st = nullptr;
  bool all_logits = false;  // logits for every token of this run (else only its last)
  // Image embeddings [media_rows, hidden]: row k replaces the token embedding at the k-th <|media_pad|> of ids
  // (config().media_pad_id); pads after the last row take their own embedding (a generated pad). Null: every id
  // takes its own embedding.
  const float* media = nullptr;
  int64_t media_rows = 0;
};

// Sizes the cache pools need.
struct CacheGeometry {
  std::vector<int> kda_layers, mla_layers;
  int64_t kda_conv_floats = 0, kda_recurrent_floats = 0;  // per KDA layer
  int64_t mla_row_floats = 0;                            // elements per token per MLA layer (lora + rope)
  int64_t mla_rope = 0;                                  // of which positional (k_r)
  std::vector<int> sparse_layers;                        // MLA layers with a DSA indexer (subset)
  int64_t index_row_bytes = 0;                           // per token per sparse layer
  // One MLA layer's cached row in dtype d.
  kernels::KvRowFormat mla_row(KvCacheDtype d) const { return {d, mla_row_floats - mla_rope, mla_rope}; }
  // Paged-cache bytes per token of context: MLA latents (in the cache dtype) and indexer keys (e4m3 + scale).
  int64_t mla_bytes_per_token(KvCacheDtype d = KvCacheDtype::kF32) const {
    return static_cast<int64_t>(mla_layers.size()) * mla_row(d).bytes();
  }
  int64_t index_bytes_per_token() const { return static_cast<int64_t>(sparse_layers.size()) * index_row_bytes; }
  int64_t slot_floats() const {
    return static_cast<int64_t>(kda_layers.size()) * (kda_conv_floats + kda_recurrent_floats);
  }
};

struct ForwardOptions {
  bool all_logits = false;        // logits for every token (else only the last)
  MlaMode mla_mode = MlaMode::kAuto;
  bool kda_force_recurrent = false;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return cfg_; }
  const CacheGeometry& cache_geometry() const { return geom_; }
  // One line each about what loading found and left aside (e.g. the vision tower it loaded); the commands
  // print them unless --quiet.
  const std::vector<std::string>& load_notes() const { return load_notes_; }
  // A standalone sequence that owns its storage (pages of kOwnPageTokens tokens, grown on demand), its
  // MLA latent rows stored in `kv` (--kv-cache-dtype).
  SequenceState new_sequence(KvCacheDtype kv = KvCacheDtype::kF32) const;
  static constexpr int64_t kOwnPageTokens = 256;
  // Owned sequences: grows pages to hold n_tokens in total (so decode up to there never allocates).
  void reserve(SequenceState& st, int64_t n_tokens) const;
  // Benchmarks only: makes an owned sequence look as if n tokens were already cached — random latent
  // rows in every MLA layer and random quantized keys in every indexer cache (KDA state stays zero).
  // Attention and indexer cost do not depend on the values, so decode/prefill timed on top measures
  // the per-token cost at context n without running an O(n²) prefill first.
  void fill_synthetic_context(SequenceState& st, int64_t n, uint64_t seed) const;
  // Bytes of the checkpoint tensors this process bound (in a cell: the replicated weights plus this rank's
  // routed experts); 0 for a GGUF file.
  uint64_t bound_weight_bytes() const { return bound_weight_bytes_; }
  // Total process CPU seconds spent in DSA indexers (all sparse layers) since load; 0 without any.
  virtual double indexer_seconds() const { return 0.0; }
  // Tests: the DSA selection of `layer` in the last forward_batch, [tokens of the batch, index_topk]
  // (positions within each sequence, ascending, −1 padded); empty for layers without an indexer.
  virtual std::span<const int32_t> last_topk(size_t /*layer*/) const { return {}; }
  // Runs T tokens of one sequence; logits: [T or 1, vocab]. media, media_rows: as in SeqRun.
  void forward(const int32_t* ids, int64_t T, SequenceState& st, std::vector<float>& logits,
               const ForwardOptions& opt = {}, const float* media = nullptr, int64_t media_rows = 0);
  // Whether the checkpoint's vision tower is loaded (K3 with vision_tower.* tensors).
  virtual bool has_vision() const { return false; }
  // The images of one request through the vision tower and projector as one batch: [sum of tokens, hidden],
  // image by image in order. Unsupported without a tower; an error for a grid the tower cannot run.
  // `stop` is asked between the tower's blocks (layers/vision_tower.h); `times`, when set, gets each stage's seconds
  // added (bench/vision_bench).
  virtual Result<std::vector<float>> encode_images(std::span<const VisionImage> images, const StopFn& stop = {},
                                                   VisionStageTimes* times = nullptr) const;
  // Runs several sequences in one step: token-wise work (projections, MoE, norms, lm_head) over the
  // concatenated tokens so weights are read once; attention per sequence. Logits rows are emitted
  // run by run (T rows when all_logits, else 1). Pool-backed sequences must already have pages for
  // their new tokens.
  virtual void forward_batch(std::span<const SeqRun> runs, std::vector<float>& logits,
                             const ForwardOptions& opt = {}) = 0;

 protected:
  Model() = default;
  // After binding: sizes the per-sequence state from the layer kinds.
  void set_geometry(const std::vector<bool>& is_kda);
  // Start of forward_batch for models without image inputs: owned sequences get pages for their new tokens, and h
  // becomes the token embeddings of every run, concatenated [T, hidden]. Returns T.
  int64_t embed_runs(std::span<const SeqRun> runs, const kernels::WeightMatrix& embed, std::vector<float>& h);
  // h[0, n) += sub[0, n): a residual connection.
  static void add_residual(std::vector<float>& h, const std::vector<float>& sub, int64_t n);
  // End of forward_batch: advances every run's token count and writes logits for the rows that need
  // them (each run's last token, or all with all_logits): final RMSNorm of h [tokens, hidden], lm_head.
  void emit_logits(std::span<const SeqRun> runs, const float* h, const float* final_norm,
                   const kernels::WeightMatrix& lm_head, std::vector<float>& logits);

  ModelConfig cfg_;
  CacheGeometry geom_;
  size_t num_layers_ = 0;
  std::vector<std::string> load_notes_;
  uint64_t bound_weight_bytes_ = 0;

 private:
  std::vector<SeqRun> one_;
  std::vector<int64_t> head_rows_;  // scratch of emit_logits
  std::vector<float> head_in_;
};

// The per-sequence state of a model with these layer kinds (what Model::cache_geometry() gives once bound): MLA,
// KDA and DSA layers, KDA state and MLA row sizes. The second form takes the layer kinds from text.attn_kind, from
// config.json alone.
CacheGeometry cache_geometry_of(const TextConfig& c, const std::vector<bool>& is_kda);
CacheGeometry cache_geometry_of(const ModelConfig& cfg);

// Reads config.json and loads the matching model; every checkpoint tensor must be bound. With a shard of
// size > 1 (a cell rank, docs/cell.md) only that rank's routed experts are bound; the shard must outlive
// the model.
Result<std::unique_ptr<Model>> load_model(const std::string& dir, ExpertShard* shard = nullptr);

}  // namespace kestrel
