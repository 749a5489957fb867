#include "media/address_policy.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace kestrel::media {
namespace {

struct V4Block {
  uint32_t base;
  int prefix;
  AddressClass cls;
};

constexpr uint32_t v4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return a << 24 | b << 16 | c << 8 | d; }

// IANA IPv4 Special-Purpose Address Registry (RFC 6890 and its updates): every block that is not globally
// reachable, plus 192.0.0.0/24 as a whole and the deprecated 6to4 relay anycast block (RFC 7526).
constexpr V4Block kV4Blocks[] = {
    {v4(0, 0, 0, 0), 8, AddressClass::kUnspecified},      // "this network" (RFC 791)
    {v4(10, 0, 0, 0), 8, AddressClass::kPrivate},         // RFC 1918
    {v4(100, 64, 0, 0), 10, AddressClass::kSharedCgnat},  // RFC 6598
    {v4(127, 0, 0, 0), 8, AddressClass::kLoopback},       // RFC 1122
    {v4(169, 254, 0, 0), 16, AddressClass::kLinkLocal},   // RFC 3927 (169.254.169.254: cloud metadata)
    {v4(172, 16, 0, 0), 12, AddressClass::kPrivate},      // RFC 1918
    {v4(192, 0, 0, 0), 24, AddressClass::kReserved},      // IETF protocol assignments (RFC 6890)
    {v4(192, 0, 2, 0), 24, AddressClass::kReserved},      // TEST-NET-1 (RFC 5737)
    {v4(192, 88, 99, 0), 24, AddressClass::kReserved},    // 6to4 relay anycast, deprecated (RFC 7526)
    {v4(192, 168, 0, 0), 16, AddressClass::kPrivate},     // RFC 1918
    {v4(198, 18, 0, 0), 15, AddressClass::kReserved},     // benchmarking (RFC 2544)
    {v4(198, 51, 100, 0), 24, AddressClass::kReserved},   // TEST-NET-2 (RFC 5737)
    {v4(203, 0, 113, 0), 24, AddressClass::kReserved},    // TEST-NET-3 (RFC 5737)
    {v4(224, 0, 0, 0), 4, AddressClass::kMulticast},      // RFC 5771
    {v4(240, 0, 0, 0), 4, AddressClass::kReserved},       // reserved (RFC 1112) incl. 255.255.255.255 broadcast
};

struct V6Block {
  std::array<uint8_t, 16> base;
  int prefix;
  AddressClass cls;
};

bool v6_in(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& base, int prefix) {
  const int whole = prefix / 8, bits = prefix % 8;
  if (std::memcmp(a.data(), base.data(), whole) != 0) return false;
  if (bits == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - bits));
  return (a[whole] & mask) == (base[whole] & mask);
}

// IANA IPv6 Special-Purpose Address Registry blocks refused inside 2000::/3, and the non-global blocks outside it
// named for their class (everything else outside 2000::/3 is refused as reserved). Checked in order.
const V6Block kV6Blocks[] = {
    {{0x20, 0x01, 0x0d, 0xb8}, 32, AddressClass::kReserved},  // documentation (RFC 3849)
    {{0x20, 0x01}, 23, AddressClass::kReserved},              // IETF protocol assignments incl. Teredo (RFC 2928)
    {{0x20, 0x02}, 16, AddressClass::kReserved},              // 6to4 (RFC 3056)
    {{0x3f, 0xff}, 20, AddressClass::kReserved},              // documentation (RFC 9637)
    {{0xfc}, 7, AddressClass::kPrivate},                      // unique local (RFC 4193)
    {{0xfe, 0x80}, 10, AddressClass::kLinkLocal},             // RFC 4291
    {{0xff}, 8, AddressClass::kMulticast},                    // RFC 4291
};

uint32_t embedded_v4(const std::array<uint8_t, 16>& a) {
  return uint32_t(a[12]) << 24 | uint32_t(a[13]) << 16 | uint32_t(a[14]) << 8 | a[15];
}

AddressClass check_v4(uint32_t a, const std::optional<Ipv4Cidr>& exempt) {
  if (exempt && exempt->contains(a)) return AddressClass::kPublic;
  return classify_ipv4(a);
}

}  // namespace

const char* address_class_name(AddressClass c) {
  switch (c) {
    case AddressClass::kPublic: return "public";
    case AddressClass::kUnspecified: return "unspecified";
    case AddressClass::kLoopback: return "loopback";
    case AddressClass::kPrivate: return "private";
    case AddressClass::kSharedCgnat: return "shared (CGNAT)";
    case AddressClass::kLinkLocal: return "link-local";
    case AddressClass::kMulticast: return "multicast";
    case AddressClass::kReserved: return "reserved";
  }
  return "reserved";
}

AddressClass classify_ipv4(uint32_t addr) {
  for (const V4Block& b : kV4Blocks)
    if (Ipv4Cidr{b.base, b.prefix}.contains(addr)) return b.cls;
  return AddressClass::kPublic;
}

AddressClass classify_ipv6(const std::array<uint8_t, 16>& a) {
  static constexpr std::array<uint8_t, 16> kZero{};
  static constexpr std::array<uint8_t, 16> kMapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static constexpr std::array<uint8_t, 16> kNat64{0x00, 0x64, 0xff, 0x9b};
  std::array<uint8_t, 16> loopback{};
  loopback[15] = 1;
  if (a == kZero) return AddressClass::kUnspecified;
  if (a == loopback) return AddressClass::kLoopback;
  // ::ffff:a.b.c.d (RFC 4291) and 64:ff9b::a.b.c.d (RFC 6052) reach the IPv4 address they carry.
  if (v6_in(a, kMapped, 96) || v6_in(a, kNat64, 96)) return classify_ipv4(embedded_v4(a));
  for (const V6Block& b : kV6Blocks)
    if (v6_in(a, b.base, b.prefix)) return b.cls;
  if ((a[0] & 0xe0) != 0x20) return AddressClass::kReserved;  // outside global unicast 2000::/3
  return AddressClass::kPublic;
}

Result<Ipv4Cidr> parse_ipv4_cidr(std::string_view text) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return invalid_argument("expected a.b.c.d/n, got '" + std::string(text) + "'");
  const std::string addr(text.substr(0, slash));
  const std::string_view len = text.substr(slash + 1);
  in_addr ia{};
  if (inet_pton(AF_INET, addr.c_str(), &ia) != 1)
    return invalid_argument("'" + addr + "' is not a dotted-quad IPv4 address");
  if (len.empty() || len.size() > 2 || len.find_first_not_of("0123456789") != std::string_view::npos)
    return invalid_argument("prefix length must be 0..32");
  const int prefix = std::stoi(std::string(len));
  if (prefix > 32) return invalid_argument("prefix length must be 0..32");
  const uint32_t base = ntohl(ia.s_addr);
  Ipv4Cidr c{base, prefix};
  const uint32_t host_mask = prefix == 0 ? 0xffffffffu : prefix == 32 ? 0 : (0xffffffffu >> prefix);
  if ((base & host_mask) != 0) return invalid_argument("'" + std::string(text) + "' has host bits set");
  return c;
}

Result<Ipv4Cidr> parse_test_exempt_cidr(std::string_view text) {
  auto c = parse_ipv4_cidr(text);
  if (!c) return c.error();
  const Ipv4Cidr bench{v4(198, 18, 0, 0), 15};
  if (c->prefix < bench.prefix || !bench.contains(c->base))
    return invalid_argument("'" + std::string(text) + "' is not inside 198.18.0.0/15 (the benchmarking range); the "
                            "test exemption covers nothing else");
  return c;
}

AddressClass AddressPolicy::check(const sockaddr* sa, socklen_t len) const {
  if (sa == nullptr) return AddressClass::kReserved;
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    sockaddr_in in{};
    std::memcpy(&in, sa, sizeof in);
    return check_v4(ntohl(in.sin_addr.s_addr), test_exempt);
  }
  if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    sockaddr_in6 in6{};
    std::memcpy(&in6, sa, sizeof in6);
    std::array<uint8_t, 16> a{};
    std::memcpy(a.data(), &in6.sin6_addr, 16);
    static constexpr std::array<uint8_t, 16> kMapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (v6_in(a, kMapped, 96)) return check_v4(embedded_v4(a), test_exempt);
    return classify_ipv6(a);
  }
  return AddressClass::kReserved;
}

}  // namespace kestrel::media
