// Remote image fetch for `image_url` parts (docs/vision.md §3.3), off unless `kestrel serve --image-url-domains`
// names the hosts it may ask. libcurl over http and https only; redirects are followed here, one hop at a time, each
// hop's scheme and host checked again (at most `max_redirects`); every connection's address is checked just before
// it is opened (media/address_policy), so DNS rebinding and redirects to private addresses are refused; the body is
// cut at `max_bytes` while it streams; connect and total timeouts; no cookies, no proxies, no .netrc, no content
// decoding. Errors are short and carry no curl or server text. Runs on the image worker pool (server/image_queue.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "media/address_policy.h"
#include "media/host_allowlist.h"

namespace kestrel::media {

struct UrlFetchOptions {
  HostAllowList hosts;
  AddressPolicy addresses;
  size_t max_bytes = size_t{20} << 20;               // = ImageLimits::max_file_bytes
  int max_redirects = 3;                             // hops after the first request
  std::chrono::milliseconds timeout{10000};          // the whole fetch, every hop
  std::chrono::milliseconds connect_timeout{5000};   // each connection (never past `timeout`)
};

// True for a URL this server would fetch if enabled: not a data: URL. Everything but data: goes to the fetcher,
// which refuses schemes other than http and https.
bool is_remote_image_url(std::string_view url);

class UrlFetcher {
 public:
  explicit UrlFetcher(UrlFetchOptions options);  // initialises libcurl once per process
  // The body of a 200 answer. Errors: kInvalidArgument ("image URL refused: ..." for the policy, "image URL fetch
  // failed: ..." for the network and the server), kTooLarge over `max_bytes`, kUnavailable when `stop` (asked while
  // the transfer runs) returned true.
  Result<std::vector<uint8_t>> fetch(std::string_view url, const std::function<bool()>& stop = {}) const;
  const UrlFetchOptions& options() const { return options_; }

 private:
  UrlFetchOptions options_;
};

}  // namespace kestrel::media
