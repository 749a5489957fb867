// Shared by the plan tests: the published K3 config (docs/configs, numbers from docs/model-math.md §1.2).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "loader/model_config.h"

namespace kestrel::plan::testing {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline ModelConfig config_of(const std::string& name) {
  const std::string path = std::string(KESTREL_SOURCE_DIR) + "/docs/configs/" + name + "/config.json";
  auto c = parse_model_config(read_text(path), path);
  if (!c) throw std::runtime_error(c.error().message());
  return *c;
}

}  // namespace kestrel::plan::testing
