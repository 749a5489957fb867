#include "app/default_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <vector>

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
bool is_model_dir(const fs::path& d) {
  std::error_code ec;
  return fs::is_regular_file(d / "config.json", ec) && fs::is_regular_file(d / "tiktoken.model", ec);
}
}  // namespace

std::string user_cache_dir() { return cache_root().string(); }

Result<std::string> default_model_dir() {
  if (const char* d = std::getenv("KESTREL_DEFAULT_MODEL"); d && *d) {
    if (!is_model_dir(d)) return not_found(std::string("$KESTREL_DEFAULT_MODEL=") + d + ": no config.json + tiktoken.model there");
    return std::string(d);
  }
  std::vector<fs::path> tried;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    tried.push_back(exe.parent_path() / "default-model");
    tried.push_back(exe.parent_path().parent_path() / "share" / "kestrel" / "default-model");
  }
#ifdef KESTREL_SOURCE_DEFAULT_MODEL
  tried.push_back(KESTREL_SOURCE_DEFAULT_MODEL);
#endif
  std::string where;
  for (const fs::path& d : tried) {
    if (is_model_dir(d)) return d.string();
    where += (where.empty() ? "" : ", ") + d.string();
  }
  return not_found("the shipped default model was not found (looked in: " + where +
                   "); pass --model DIR, set KESTREL_DEFAULT_MODEL, or use --preset k3-default for a random-weight one");
}

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
