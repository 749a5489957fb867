// The embedded default: a small K3-architecture checkpoint with RANDOM weights, generated once into
// the user cache directory so every command runs on a fresh machine without downloads.
#pragma once

#include <string>

#include "base/result.h"

namespace kestrel::app {

// Returns the directory of the preset's checkpoint, generating it on first use
// ($KESTREL_CACHE_DIR, else $XDG_CACHE_HOME/kestrel, else ~/.cache/kestrel).
Result<std::string> ensure_preset_model(const std::string& preset, bool verbose);

}  // namespace kestrel::app
