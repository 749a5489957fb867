// The default model: a small trained K3-architecture checkpoint shipped with the source (models/default,
// tools/default_model/), loaded as it is. Presets (k3-default, k3-tiny, ...) are RANDOM-weight checkpoints,
// generated once into the user cache directory (tests, benchmarks, `make-model`).
#pragma once

#include <string>

#include "base/result.h"

namespace kestrel::app {

// Directory of the shipped default model: $KESTREL_DEFAULT_MODEL if set, else default-model/ or
// ../share/kestrel/default-model/ next to the running binary, else the source tree's models/default.
Result<std::string> default_model_dir();

// Returns the directory of the preset's checkpoint, generating it on first use
// ($KESTREL_CACHE_DIR, else $XDG_CACHE_HOME/kestrel, else ~/.cache/kestrel).
Result<std::string> ensure_preset_model(const std::string& preset, bool verbose);

// The user cache directory named above (generated presets, the weights-digest memo).
std::string user_cache_dir();

}  // namespace kestrel::app
