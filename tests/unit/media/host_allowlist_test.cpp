// media/host_allowlist: exact names, wildcard subdomains, no suffix or prefix confusion, and the list syntax
// (docs/vision.md §3.3).
#include "media/host_allowlist.h"

#include <gtest/gtest.h>

namespace kestrel::media {
namespace {

HostAllowList list(const char* csv) {
  auto l = HostAllowList::parse(csv);
  EXPECT_TRUE(l) << csv << ": " << l.error().message();
  return l ? *l : HostAllowList{};
}

TEST(HostAllowList, ExactNames) {
  const HostAllowList l = list("example.com,images.example.org");
  EXPECT_TRUE(l.allows("example.com"));
  EXPECT_TRUE(l.allows("EXAMPLE.com"));
  EXPECT_TRUE(l.allows("example.com."));  // the absolute form
  EXPECT_TRUE(l.allows("images.example.org"));
  EXPECT_FALSE(l.allows("www.example.com"));      // an exact entry allows no subdomain
  EXPECT_FALSE(l.allows("evilexample.com"));      // suffix confusion
  EXPECT_FALSE(l.allows("example.com.evil.net"));  // prefix confusion
  EXPECT_FALSE(l.allows("example.co"));
  EXPECT_FALSE(l.allows("example.org"));
  EXPECT_FALSE(l.allows("example.com.."));
  EXPECT_FALSE(l.allows(""));
}

TEST(HostAllowList, WildcardMatchesSubdomainsOnly) {
  const HostAllowList l = list("*.cdn.example");
  EXPECT_TRUE(l.allows("a.cdn.example"));
  EXPECT_TRUE(l.allows("x.y.cdn.example"));
  EXPECT_TRUE(l.allows("A.CDN.Example."));
  EXPECT_FALSE(l.allows("cdn.example"));  // not the domain itself: list it too
  EXPECT_FALSE(l.allows("evilcdn.example"));
  EXPECT_FALSE(l.allows("a.evilcdn.example"));
  EXPECT_FALSE(l.allows("cdn.example.evil.net"));
  EXPECT_FALSE(l.allows(".cdn.example"));  // empty label
  EXPECT_FALSE(l.allows("a.cdn.example.com"));
  const HostAllowList both = list("cdn.example,*.cdn.example");
  EXPECT_TRUE(both.allows("cdn.example"));
  EXPECT_TRUE(both.allows("a.cdn.example"));
}

TEST(HostAllowList, Ipv4LiteralsMatchExactly) {
  const HostAllowList l = list("198.51.100.7");
  EXPECT_TRUE(l.allows("198.51.100.7"));
  EXPECT_FALSE(l.allows("198.51.100.70"));
  EXPECT_FALSE(l.allows("1198.51.100.7"));
  EXPECT_FALSE(l.allows("[::ffff:198.51.100.7]"));
}

TEST(HostAllowList, HostsWithOtherCharactersNeverMatch) {
  const HostAllowList l = list("example.com,*.example.com");
  for (const char* h : {"example.com:80", "user@example.com", "example.com/", "exa mple.com", "a.example.com\n",
                        "[::1]", "a..example.com", "*.example.com", "a.example.com%00"})
    EXPECT_FALSE(l.allows(h)) << h;
}

TEST(HostAllowList, ListSyntax) {
  for (const char* bad : {"", ",", "example.com,", ",example.com", "*", "*.", "a.*.example", "*example.com",
                          "**.example.com", "example..com", ".example.com", "exa mple.com", "http://example.com",
                          "example.com/x", "::1", "[::1]", "example.com:443", "ex_ample.com"}) {
    auto l = HostAllowList::parse(bad);
    EXPECT_FALSE(l) << "'" << bad << "'";
  }
  const HostAllowList l = list("Example.COM,*.Cdn.Example.");
  EXPECT_EQ(l.exact(), std::vector<std::string>{"example.com"});
  EXPECT_EQ(l.suffixes(), std::vector<std::string>{"cdn.example"});
}

}  // namespace
}  // namespace kestrel::media
