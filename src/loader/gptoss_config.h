// gpt-oss config.json (model_type "gpt_oss", transformers' GptOssConfig) → typed ModelConfig (internal to loader/;
// model_config.cpp dispatches here on model_type; a `gpt-oss` GGUF file's metadata becomes the same JSON in
// gguf_config.cpp). Key names and defaults follow transformers' GptOssConfig; every error names the file and the
// key. What the model does with them: docs/model-math.md §12.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/result.h"
#include "loader/model_config.h"

namespace kestrel {

// `j` is the top-level config object; c.model_type is already set.
Status parse_gpt_oss_config(const nlohmann::json& j, const std::string& label, ModelConfig& c);

}  // namespace kestrel
