// media/address_policy: every refused range at its first and last address, the public neighbours just outside it,
// IPv6 forms that carry an IPv4 address, and the test-only exemption (docs/vision.md §3.3).
#include "media/address_policy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <string>

namespace kestrel::media {
namespace {

// The class the policy gives `text` as a connect address (IPv4 or IPv6 literal).
AddressClass check(const std::string& text, const AddressPolicy& policy = {}) {
  sockaddr_in in{};
  if (inet_pton(AF_INET, text.c_str(), &in.sin_addr) == 1) {
    in.sin_family = AF_INET;
    return policy.check(reinterpret_cast<const sockaddr*>(&in), sizeof in);
  }
  sockaddr_in6 in6{};
  EXPECT_EQ(inet_pton(AF_INET6, text.c_str(), &in6.sin6_addr), 1) << text;
  in6.sin6_family = AF_INET6;
  return policy.check(reinterpret_cast<const sockaddr*>(&in6), sizeof in6);
}

using C = AddressClass;

struct Case {
  const char* addr;
  AddressClass cls;
};

void expect_all(std::initializer_list<Case> cases) {
  for (const Case& c : cases)
    EXPECT_EQ(check(c.addr), c.cls) << c.addr << " is " << address_class_name(check(c.addr)) << ", expected "
                                    << address_class_name(c.cls);
}

TEST(AddressPolicy, Ipv4RefusedRangesAtTheirEdges) {
  expect_all({
      {"0.0.0.0", C::kUnspecified},       {"0.255.255.255", C::kUnspecified},
      {"10.0.0.0", C::kPrivate},          {"10.255.255.255", C::kPrivate},
      {"100.64.0.0", C::kSharedCgnat},    {"100.127.255.255", C::kSharedCgnat},
      {"127.0.0.0", C::kLoopback},        {"127.0.0.1", C::kLoopback},          {"127.255.255.255", C::kLoopback},
      {"169.254.0.0", C::kLinkLocal},     {"169.254.169.254", C::kLinkLocal},   {"169.254.255.255", C::kLinkLocal},
      {"172.16.0.0", C::kPrivate},        {"172.31.255.255", C::kPrivate},
      {"192.0.0.0", C::kReserved},        {"192.0.0.255", C::kReserved},
      {"192.0.2.0", C::kReserved},        {"192.0.2.255", C::kReserved},
      {"192.88.99.0", C::kReserved},      {"192.88.99.255", C::kReserved},
      {"192.168.0.0", C::kPrivate},       {"192.168.255.255", C::kPrivate},
      {"198.18.0.0", C::kReserved},       {"198.19.255.255", C::kReserved},
      {"198.51.100.0", C::kReserved},     {"198.51.100.255", C::kReserved},
      {"203.0.113.0", C::kReserved},      {"203.0.113.255", C::kReserved},
      {"224.0.0.0", C::kMulticast},       {"239.255.255.255", C::kMulticast},
      {"240.0.0.0", C::kReserved},        {"255.255.255.255", C::kReserved},
  });
}

TEST(AddressPolicy, Ipv4PublicNeighboursOfEveryRange) {
  expect_all({
      {"1.0.0.0", C::kPublic},         {"8.8.8.8", C::kPublic},         {"9.255.255.255", C::kPublic},
      {"11.0.0.0", C::kPublic},        {"100.63.255.255", C::kPublic},  {"100.128.0.0", C::kPublic},
      {"126.255.255.255", C::kPublic}, {"128.0.0.0", C::kPublic},       {"169.253.255.255", C::kPublic},
      {"169.255.0.0", C::kPublic},     {"172.15.255.255", C::kPublic},  {"172.32.0.0", C::kPublic},
      {"191.255.255.255", C::kPublic}, {"192.0.1.0", C::kPublic},       {"192.0.3.0", C::kPublic},
      {"192.88.98.255", C::kPublic},   {"192.88.100.0", C::kPublic},    {"192.167.255.255", C::kPublic},
      {"192.169.0.0", C::kPublic},     {"198.17.255.255", C::kPublic},  {"198.20.0.0", C::kPublic},
      {"198.51.99.255", C::kPublic},   {"198.51.101.0", C::kPublic},    {"203.0.112.255", C::kPublic},
      {"203.0.114.0", C::kPublic},     {"223.255.255.255", C::kPublic},
  });
}

TEST(AddressPolicy, Ipv6Ranges) {
  expect_all({
      {"::", C::kUnspecified},
      {"::1", C::kLoopback},
      {"::2", C::kReserved},                  // IPv4-compatible (deprecated), outside 2000::/3
      {"::127.0.0.1", C::kReserved},
      {"fc00::", C::kPrivate},                {"fd12:3456::1", C::kPrivate},
      {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", C::kPrivate},
      {"fe80::", C::kLinkLocal},              {"fe80::1", C::kLinkLocal},
      {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", C::kLinkLocal},
      {"fec0::1", C::kReserved},              // site-local (deprecated)
      {"ff02::1", C::kMulticast},             {"ff00::", C::kMulticast},
      {"2001:db8::1", C::kReserved},          // documentation
      {"2001::1", C::kReserved},              // Teredo
      {"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", C::kReserved},  // end of 2001::/23
      {"2002:c0a8:101::1", C::kReserved},     // 6to4 carrying 192.168.1.1
      {"3fff::1", C::kReserved},              // documentation (RFC 9637)
      {"64:ff9b:1::1", C::kReserved},         // local-use NAT64
      {"100::1", C::kReserved},               // discard-only
      {"5f00::1", C::kReserved},              // SRv6 SIDs
      {"4000::1", C::kReserved},              // unassigned, outside 2000::/3
      {"2001:200::1", C::kPublic},            // first after 2001::/23
      {"2001:4860:4860::8888", C::kPublic},
      {"2606:4700::1111", C::kPublic},
      {"3ffe::1", C::kPublic},
      {"2000::", C::kPublic},
  });
}

TEST(AddressPolicy, Ipv6FormsOfIpv4AreJudgedByTheIpv4Address) {
  expect_all({
      {"::ffff:127.0.0.1", C::kLoopback},       {"::ffff:10.1.2.3", C::kPrivate},
      {"::ffff:172.16.0.1", C::kPrivate},       {"::ffff:192.168.0.1", C::kPrivate},
      {"::ffff:169.254.169.254", C::kLinkLocal}, {"::ffff:100.64.0.1", C::kSharedCgnat},
      {"::ffff:0.0.0.0", C::kUnspecified},      {"::ffff:224.0.0.1", C::kMulticast},
      {"::ffff:198.18.0.1", C::kReserved},      {"::ffff:8.8.8.8", C::kPublic},
      {"::ffff:7f00:1", C::kLoopback},          // the same mapped loopback in hex
      {"64:ff9b::127.0.0.1", C::kLoopback},     {"64:ff9b::169.254.169.254", C::kLinkLocal},
      {"64:ff9b::8.8.8.8", C::kPublic},
  });
}

TEST(AddressPolicy, OtherFamiliesAndShortAddressesAreRefused) {
  sockaddr sa{};
  sa.sa_family = AF_UNIX;
  EXPECT_EQ(AddressPolicy{}.check(&sa, sizeof sa), C::kReserved);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(0x08080808);
  EXPECT_EQ(AddressPolicy{}.check(reinterpret_cast<const sockaddr*>(&in), sizeof in), C::kPublic);
  EXPECT_EQ(AddressPolicy{}.check(reinterpret_cast<const sockaddr*>(&in), 4), C::kReserved);  // truncated
  EXPECT_EQ(AddressPolicy{}.check(nullptr, 0), C::kReserved);
}

TEST(AddressPolicy, TestExemptionCoversExactlyItsBlock) {
  auto cidr = parse_test_exempt_cidr("198.18.0.0/30");
  ASSERT_TRUE(cidr) << cidr.error().message();
  AddressPolicy p;
  p.test_exempt = *cidr;
  EXPECT_EQ(check("198.18.0.1", p), C::kPublic);
  EXPECT_EQ(check("198.18.0.3", p), C::kPublic);
  EXPECT_EQ(check("::ffff:198.18.0.2", p), C::kPublic);
  EXPECT_EQ(check("198.18.0.4", p), C::kReserved);
  EXPECT_EQ(check("127.0.0.1", p), C::kLoopback);
  EXPECT_EQ(check("10.0.0.1", p), C::kPrivate);
  EXPECT_EQ(check("198.18.0.1"), C::kReserved);  // without the flag
}

TEST(AddressPolicy, TestExemptionIsRefusedOutsideTheBenchmarkingRange) {
  EXPECT_TRUE(parse_test_exempt_cidr("198.18.0.0/15"));
  EXPECT_TRUE(parse_test_exempt_cidr("198.19.255.255/32"));
  for (const char* bad : {"198.16.0.0/14", "127.0.0.0/8", "10.0.0.0/8", "169.254.169.254/32", "0.0.0.0/0",
                          "198.20.0.0/24", "198.18.0.1/30", "198.18.0.0", "198.18.0.0/33", "198.18.0.0/-1",
                          "198.18.0.0/x", "198.018.0.0/24", "::1/128", ""})
    EXPECT_FALSE(parse_test_exempt_cidr(bad)) << bad;
}

TEST(AddressPolicy, CidrParsing) {
  auto c = parse_ipv4_cidr("10.0.0.0/8");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->base, 0x0a000000u);
  EXPECT_EQ(c->prefix, 8);
  EXPECT_TRUE(c->contains(0x0affffffu));
  EXPECT_FALSE(c->contains(0x0b000000u));
  auto all = parse_ipv4_cidr("0.0.0.0/0");
  ASSERT_TRUE(all);
  EXPECT_TRUE(all->contains(0xffffffffu));
  EXPECT_FALSE(parse_ipv4_cidr("10.0.0.1/8"));  // host bits
}

}  // namespace
}  // namespace kestrel::media
