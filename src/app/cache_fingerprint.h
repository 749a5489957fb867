// What besides the tokens decides whether cached prefix state can be reused (the prefix cache's model fingerprint,
// cache/block_hash.h); the scheduler appends the page size and the cache dtype.
#pragma once

#include <string>

#include "base/result.h"

namespace kestrel::app {

// `shared_tiers` (a disk or Redis tier is configured: objects outlive this process and may be read by servers
// elsewhere): the model is named by the digest of its bytes (loader/weights_digest.h, memoized in the user cache
// directory), so the same weights at another path, on another machine or after a restart share objects, and changed
// weights never do. Otherwise the prefix cache lives in this process only and the files' paths, sizes and
// modification times name the model (no bytes read). Either way the kernels mode follows.
Result<std::string> cache_fingerprint(const std::string& model, bool fast_kernels, bool shared_tiers, bool verbose);

}  // namespace kestrel::app
