// Weight tensor inventory derived from a typed ModelConfig: every tensor our binder binds (name, dtype,
// shape), tagged with the component it belongs to and how `kestrel plan` spreads it over devices.
// Routed-expert tensors are listed once with `copies` = num_experts ("{e}" in the name stands for the
// expert index), so a 2.8 T-parameter model stays a few thousand entries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "loader/model_config.h"
#include "tensor/dtype.h"

namespace kestrel::plan {

enum class Component {
  kEmbedding, kLmHead, kNorms, kKda, kMla, kIndexer, kDenseMlp, kRouter, kLatentProj, kSharedExperts,
  kRoutedExperts, kVision
};
inline constexpr int kNumComponents = 12;
const char* component_name(Component c);

// How a tensor is placed under TP/EP (see docs/PERFORMANCE.md "kestrel plan" assumptions).
enum class Placement {
  kReplicated,  // every device holds it (norms, low-rank/latent projections, router, indexer, vision)
  kTensor,      // split over the attention TP group (heads, MLP width, vocab)
  kExpert,      // routed experts, spread over the EP group (whole experts per rank)
};

// Format of routed-expert weights. kCheckpoint = what the config declares (MXFP4 or BF16).
enum class ExpertFormat { kCheckpoint, kMxfp4, kBf16, kW4a8 };
Result<ExpertFormat> parse_expert_format(const std::string& s);
const char* expert_format_name(ExpertFormat f);

struct InventoryOptions {
  ExpertFormat experts = ExpertFormat::kCheckpoint;
  int w4a8_group_size = 32;  // int4 weights + one bf16 scale per group (compressed-tensors pack-quantized)
};

struct TensorEntry {
  std::string name;            // full checkpoint name; "{e}" = expert index when copies > 1
  DType dtype;
  std::vector<int64_t> shape;  // as stored (packed formats: packed shape)
  Component component;
  Placement placement;
  int layer = -1;              // zero-based decoder layer; -1 outside the decoder stack
  int64_t copies = 1;          // identical tensors (one per routed expert)
  int64_t params = 0;          // logical parameters per copy (packed weights: unpacked count; scales: 0)

  int64_t bytes_per_copy() const;
  int64_t bytes() const { return bytes_per_copy() * copies; }
};

struct Inventory {
  std::vector<TensorEntry> tensors;
  ExpertFormat expert_format = ExpertFormat::kBf16;  // resolved (never kCheckpoint)
  bool vision_counted = false;
  std::string vision_note;  // why the vision tower was not counted, when it was not
};

// Fails (invalid_argument) only for options that do not fit the config (e.g. a W4A8 group size that
// does not divide the expert input widths).
Result<Inventory> build_inventory(const ModelConfig& cfg, const InventoryOptions& opt);

}  // namespace kestrel::plan
