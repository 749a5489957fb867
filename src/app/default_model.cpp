#include "app/default_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "base/progress.h"
#include "chat/model_tokenizer.h"
#include "models/checkpoint_generator.h"

namespace kestrel::app {
namespace fs = std::filesystem;

namespace {
fs::path cache_root() {
  if (const char* d = std::getenv("KESTREL_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "kestrel";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "kestrel";
  return fs::temp_directory_path() / "kestrel-cache";
}
// Bump when the generator's output changes so stale caches are rebuilt.
constexpr const char* kGeneratorVersion = "3";
}  // namespace

Result<std::string> ensure_preset_model(const std::string& preset, bool verbose) {
  auto spec = gen_preset(preset);
  if (!spec) return spec.error();
  const fs::path dir = cache_root() / ("model-" + preset + "-v" + kGeneratorVersion);
  const fs::path done = dir / ".complete";
  if (fs::exists(done)) return dir.string();
  if (verbose)
    std::fprintf(stderr, "kestrel: generating the '%s' model (RANDOM weights, for trying the engine) in %s ...\n",
                 preset.c_str(), dir.string().c_str());
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  {
    Progress progress("generating " + preset, 0, 0);
    KESTREL_RETURN_IF_ERROR(generate_checkpoint(*spec, tmp.string(), &progress));
  }
  if (spec->vocab >= 512 && spec->vocab <= 66048)
    KESTREL_RETURN_IF_ERROR(chat::write_synthetic_k3_tokenizer(tmp.string(), spec->vocab));
  std::ofstream(tmp / ".complete") << kGeneratorVersion << "\n";
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec && !fs::exists(done)) return io_error(dir.string() + ": cannot install generated model: " + ec.message());
  fs::remove_all(tmp, ec);
  return dir.string();
}

}  // namespace kestrel::app
