// libFuzzer target: config.json parsing (typed ModelConfig) on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = kestrel::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  (void)r;
  return 0;
}
