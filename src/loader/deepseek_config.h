// DeepSeek V3 / Kimi K2 / DeepSeek V3.2 config.json → typed ModelConfig (internal to loader/;
// model_config.cpp dispatches here on model_type). Key names and defaults follow the HF configs
// (docs/model-math.md §5.1, §6.1, §7, §8); every error names the file and the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/result.h"
#include "loader/model_config.h"

namespace kestrel {

// `j` is the top-level config object; c.model_type is already set.
Status parse_deepseek_config(const nlohmann::json& j, const std::string& label, ModelConfig& c);

// rope_theta + rope_scaling (HF) or rope_parameters (transformers ≥ 5 style): default or YaRN (factor,
// beta_fast, beta_slow, mscale, mscale_all_dim, original_max_position_embeddings, truncate); others refused.
Status parse_rope_config(const nlohmann::json& j, const std::string& label, MlaRopeConfig& rope);

// YaRN attention magnitude 0.1·m·ln(s) + 1 (1 for s ≤ 1); used for the softmax scale and cos/sin.
double yarn_mscale(double factor, double m);

}  // namespace kestrel
