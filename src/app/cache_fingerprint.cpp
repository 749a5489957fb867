#include "app/cache_fingerprint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "app/default_model.h"
#include "loader/weights_digest.h"

namespace kestrel::app {
namespace fs = std::filesystem;

namespace {
std::string file_identity(const std::string& model) {
  std::error_code ec;
  std::string f = "model=" + fs::weakly_canonical(model, ec).string();
  std::vector<fs::path> files;
  if (fs::is_directory(model, ec)) {
    for (const auto& e : fs::directory_iterator(model, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path());
  } else {
    files.push_back(model);
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    const auto size = fs::file_size(p, ec);
    const auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
    f += "|" + p.filename().string() + ":" + std::to_string(size) + ":" + std::to_string(mtime);
  }
  return f;
}
}  // namespace

Result<std::string> cache_fingerprint(const std::string& model, bool fast_kernels, bool shared_tiers, bool verbose) {
  std::string f;
  if (shared_tiers) {
    auto d = weights_digest(model, user_cache_dir());
    if (!d) return d.error();
    if (verbose)
      std::fprintf(stderr, "kestrel serve: weights digest %.16s… (%lld files, %.1f MiB, %.1f MiB read in %.2f s)\n",
                   d->hex.c_str(), static_cast<long long>(d->files), static_cast<double>(d->bytes) / (1 << 20),
                   static_cast<double>(d->hashed_bytes) / (1 << 20), d->seconds);
    f = "weights=" + d->hex;
  } else {
    f = file_identity(model);
  }
  return f + (fast_kernels ? "|kernels=fast" : "|kernels=exact");
}

}  // namespace kestrel::app
