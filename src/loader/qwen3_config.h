// Qwen3-MoE config.json (model_type "qwen3_moe", transformers' Qwen3MoeConfig) → typed ModelConfig (internal to
// loader/; model_config.cpp dispatches here on model_type). Key names and defaults follow transformers'
// Qwen3MoeConfig; every error names the file and the key. What the model does with them: docs/model-math.md §11.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/result.h"
#include "loader/model_config.h"

namespace kestrel {

// `j` is the top-level config object; c.model_type is already set.
Status parse_qwen3_moe_config(const nlohmann::json& j, const std::string& label, ModelConfig& c);

}  // namespace kestrel
