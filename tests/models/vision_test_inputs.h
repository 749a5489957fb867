// Inputs shared by the vision goldens' tests: the hashed pixel values of tools/gen_vision_tower_goldens.py and the
// `kestrel make-model` flags a golden records for its checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/checkpoint_generator.h"

namespace kestrel::testing {

// tools/gen_vision_tower_goldens.py pixel_values(): (u − 127.5) / 127.5 in double, rounded to float, with u the
// top byte of ((image · 1000003 + k) · 2654435761) mod 2^32.
inline std::vector<float> hashed_pixels(uint64_t image, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const uint64_t h = ((image * 1000003u + static_cast<uint64_t>(k)) * 2654435761u) & 0xFFFFFFFFu;
    v[static_cast<size_t>(k)] = static_cast<float>((static_cast<double>(h >> 24) - 127.5) / 127.5);
  }
  return v;
}

// The generator spec edits of the `kestrel make-model` flags the vision goldens use (--vt-*, --hidden).
inline void apply_make_model_flags(const std::vector<std::string>& flags, GenSpec& s) {
  const std::map<std::string, int GenSpec::*> fields = {
      {"--vt-layers", &GenSpec::vt_layers}, {"--vt-hidden", &GenSpec::vt_hidden},
      {"--vt-intermediate", &GenSpec::vt_intermediate}, {"--vt-heads", &GenSpec::vt_heads},
      {"--vt-qkv", &GenSpec::vt_qkv}, {"--vt-pos-grid", &GenSpec::vt_pos_grid}, {"--hidden", &GenSpec::hidden}};
  for (size_t i = 0; i + 1 < flags.size(); i += 2) s.*fields.at(flags[i]) = std::stoi(flags[i + 1]);
}

}  // namespace kestrel::testing
