#include "media/url_fetch.h"

#include <curl/curl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <mutex>
#include <string>

#include "base/check.h"

namespace kestrel::media {
namespace {

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

Status refused(const std::string& why) { return invalid_argument("image URL refused: " + why); }
Status failed(const std::string& why) { return invalid_argument("image URL fetch failed: " + why); }

// What the callbacks of one fetch share (every hop).
struct Transfer {
  const AddressPolicy* policy = nullptr;
  size_t max_bytes = 0;
  const std::function<bool()>* stop = nullptr;
  std::vector<uint8_t> body;
  bool over_limit = false;
  bool address_refused = false;
  bool stopped = false;
};

// Every connection curl opens passes here with the address it resolved, before connect(): the address policy.
curl_socket_t open_socket(void* clientp, curlsocktype purpose, curl_sockaddr* a) {
  auto* t = static_cast<Transfer*>(clientp);
  if (purpose != CURLSOCKTYPE_IPCXN || t->policy->check(&a->addr, a->addrlen) != AddressClass::kPublic) {
    t->address_refused = true;
    return CURL_SOCKET_BAD;
  }
  return ::socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

size_t write_body(char* data, size_t size, size_t n, void* clientp) {
  auto* t = static_cast<Transfer*>(clientp);
  const size_t bytes = size * n;
  if (bytes > t->max_bytes - t->body.size()) {
    t->over_limit = true;
    return 0;  // != bytes: curl aborts with CURLE_WRITE_ERROR
  }
  t->body.insert(t->body.end(), data, data + bytes);
  return bytes;
}

int progress(void* clientp, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(clientp);
  if (*t->stop && (*t->stop)()) {
    t->stopped = true;
    return 1;  // aborts with CURLE_ABORTED_BY_CALLBACK
  }
  return 0;
}

using Easy = std::unique_ptr<CURL, decltype(&curl_easy_cleanup)>;
using Url = std::unique_ptr<CURLU, decltype(&curl_url_cleanup)>;

// The options every hop shares.
void set_common(CURL* h, Transfer& t) {
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);  // hops are followed by fetch(), each one checked
  curl_easy_setopt(h, CURLOPT_PROXY, "");           // "" disables proxies, also those named by the environment
  curl_easy_setopt(h, CURLOPT_NETRC, static_cast<long>(CURL_NETRC_IGNORED));
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "kestrel-image-fetch");
  curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(t.max_bytes));  // announced length
  curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  // No CURLOPT_COOKIEFILE (the cookie engine stays off), no CURLOPT_ACCEPT_ENCODING (bytes are counted as sent).
}

Status curl_error(CURLcode rc, const Transfer& t, size_t max_bytes) {
  if (t.stopped) return unavailable("image fetch stopped");
  if (t.address_refused) return refused("address not allowed");
  if (t.over_limit || rc == CURLE_FILESIZE_EXCEEDED)
    return too_large("image URL refused: the body is over the limit of " + std::to_string(max_bytes) + " bytes");
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT: return failed("timed out");
    case CURLE_COULDNT_RESOLVE_HOST: return failed("host not found");
    case CURLE_COULDNT_CONNECT: return failed("could not connect");
    case CURLE_UNSUPPORTED_PROTOCOL: return refused("scheme not allowed");
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CACERT_BADFILE: return failed("TLS error");
    default: return failed("transfer error");
  }
}

}  // namespace

bool is_remote_image_url(std::string_view url) { return !starts_with_ci(url, "data:"); }

UrlFetcher::UrlFetcher(UrlFetchOptions options) : options_(std::move(options)) {
  static std::once_flag once;
  std::call_once(once, [] { KCHECK(curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK, "curl_global_init failed"); });
}

Result<std::vector<uint8_t>> UrlFetcher::fetch(std::string_view url, const std::function<bool()>& stop) const {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options_.timeout;
  Url u(nullptr, curl_url_cleanup);  // the hop's parsed URL; outlives the handle that points to it
  Easy easy(curl_easy_init(), curl_easy_cleanup);
  if (!easy) return failed("out of resources");
  Transfer t;
  t.policy = &options_.addresses;
  t.max_bytes = options_.max_bytes;
  t.stop = &stop;
  set_common(easy.get(), t);
  std::string current(url);
  for (int hop = 0;; ++hop) {
    // The scheme and the host of this hop, from the same parsed URL curl will use.
    if (!starts_with_ci(current, "http://") && !starts_with_ci(current, "https://")) return refused("scheme not allowed");
    u.reset(curl_url());
    if (!u) return failed("out of resources");
    if (curl_url_set(u.get(), CURLUPART_URL, current.c_str(), 0) != CURLUE_OK) return refused("malformed URL");
    char* host = nullptr;
    if (curl_url_get(u.get(), CURLUPART_HOST, &host, 0) != CURLUE_OK || host == nullptr)
      return refused("malformed URL");
    const bool allowed = options_.hosts.allows(host);
    curl_free(host);
    if (!allowed) return refused("host not allowed");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return failed("timed out");
    curl_easy_setopt(easy.get(), CURLOPT_CURLU, u.get());
    curl_easy_setopt(easy.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(left));
    curl_easy_setopt(easy.get(), CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min<int64_t>(left, options_.connect_timeout.count())));
    t.body.clear();
    const CURLcode rc = curl_easy_perform(easy.get());
    if (rc != CURLE_OK) return curl_error(rc, t, options_.max_bytes);
    long status = 0;
    curl_easy_getinfo(easy.get(), CURLINFO_RESPONSE_CODE, &status);
    if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
      char* next = nullptr;
      curl_easy_getinfo(easy.get(), CURLINFO_REDIRECT_URL, &next);
      if (next == nullptr) return failed("redirect without a usable location");
      if (hop >= options_.max_redirects) return refused("too many redirects");
      current = next;  // copied before the handle is reused
      continue;
    }
    if (status != 200) return failed("HTTP status " + std::to_string(status));
    return std::move(t.body);
  }
}

}  // namespace kestrel::media
