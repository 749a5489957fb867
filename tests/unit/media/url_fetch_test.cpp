// media/url_fetch refusals that need no network: schemes other than http(s), hosts off the allow-list, malformed
// URLs, and allow-listed names or literals whose address is loopback, private or link-local, refused before any
// connection is made (a listening loopback socket sees none). The fetches that need an allowed address (success,
// redirects, the byte cap, timeouts) are in tests/integration/test_vision_url.py (docs/vision.md §3.3).
#include "media/url_fetch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace kestrel::media {
namespace {

UrlFetcher fetcher(const char* hosts) {
  UrlFetchOptions o;
  auto l = HostAllowList::parse(hosts);
  EXPECT_TRUE(l) << l.error().message();
  o.hosts = *l;
  o.timeout = std::chrono::milliseconds(5000);
  return UrlFetcher(std::move(o));
}

std::string refusal(const UrlFetcher& f, const std::string& url) {
  auto r = f.fetch(url);
  EXPECT_FALSE(r) << url;
  return r ? std::string() : r.error().message();
}

TEST(UrlFetch, OnlyHttpAndHttpsSchemes) {
  const UrlFetcher f = fetcher("example.com,localhost");
  for (const char* url : {"file:///etc/passwd", "FILE://localhost/etc/passwd", "ftp://example.com/a.png",
                          "gopher://example.com/", "dict://example.com/", "ldap://example.com/", "tftp://example.com/x",
                          "javascript:alert(1)", "//example.com/a.png", "example.com/a.png", "httpx://example.com/"})
    EXPECT_EQ(refusal(f, url), "image URL refused: scheme not allowed") << url;
}

TEST(UrlFetch, HostsOffTheListAreRefusedBeforeAnyLookup) {
  const UrlFetcher f = fetcher("example.com,*.cdn.example");
  for (const char* url : {"http://evilexample.com/a.png", "https://example.com.evil.net/a.png",
                          "http://cdn.example/a.png", "http://127.0.0.1/a.png", "http://[::1]/a.png",
                          "http://example.com@127.0.0.1/a.png", "http://169.254.169.254/latest/meta-data/"})
    EXPECT_EQ(refusal(f, url), "image URL refused: host not allowed") << url;
}

TEST(UrlFetch, MalformedUrls) {
  const UrlFetcher f = fetcher("example.com");
  for (const char* url : {"http://", "http://[::1/a.png", "http://exa mple.com/a.png"})
    EXPECT_EQ(refusal(f, url), "image URL refused: malformed URL") << url;
}

TEST(UrlFetch, AllowListedNamesAndLiteralsOnRefusedAddressesNeverConnect) {
  // A loopback listener: had the fetcher connected, a connection would be waiting to be accepted.
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(ls, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(ls, 8), 0);
  socklen_t n = sizeof a;
  ASSERT_EQ(::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &n), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const UrlFetcher f = fetcher("localhost,127.0.0.1,10.0.0.1,169.254.169.254,0.0.0.0");
  for (const std::string host : {"localhost", "127.0.0.1", "0.0.0.0"})
    EXPECT_EQ(refusal(f, "http://" + host + ":" + port + "/a.png"), "image URL refused: address not allowed") << host;
  EXPECT_EQ(::accept(ls, nullptr, nullptr), -1);  // nothing ever connected
  EXPECT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK);
  ::close(ls);
  // No route is needed to refuse these: the address is checked before connect().
  for (const char* url : {"http://10.0.0.1/a.png", "http://169.254.169.254/latest/meta-data/"})
    EXPECT_EQ(refusal(f, url), "image URL refused: address not allowed") << url;
}

// The allow-list judges the host of the URL curl itself parsed and then connects to (one parse, CURLOPT_CURLU), so a
// URL that two parsers read differently (backslash before '@', numeric IPv4 forms, percent-encoded names) cannot pass
// the check as one host and connect to another.
TEST(UrlFetch, TheHostCheckedIsTheHostCurlConnectsTo) {
  const UrlFetcher listed_name = fetcher("example.com");
  for (const char* url : {"http://example.com\\@127.0.0.1/a.png", "http://0x7f000001/",
                          "http://127.1/", "http://017700000001/"})
    EXPECT_EQ(refusal(listed_name, url), "image URL refused: host not allowed") << url;
  const UrlFetcher listed_loopback = fetcher("127.0.0.1,localhost");
  for (const char* url : {"http://0x7f000001:9/a.png", "http://127.1:9/", "http://%6cocalhost:9/",
                          "http://localhost\\@127.0.0.1:9/"})
    EXPECT_EQ(refusal(listed_loopback, url), "image URL refused: address not allowed") << url;
}

TEST(UrlFetch, DataUrlsAreNotRemote) {
  EXPECT_FALSE(is_remote_image_url("data:image/png;base64,AAAA"));
  EXPECT_FALSE(is_remote_image_url("DATA:image/png;base64,AAAA"));
  EXPECT_TRUE(is_remote_image_url("http://example.com/a.png"));
  EXPECT_TRUE(is_remote_image_url("file:///etc/passwd"));
}

}  // namespace
}  // namespace kestrel::media
