// Which IP addresses a remote image fetch may connect to (docs/vision.md §3.3): the public unicast space only.
// Loopback, private (RFC 1918, IPv6 unique-local), link-local (169.254/16 with the cloud metadata address,
// fe80::/10), shared CGNAT space, unspecified, multicast, broadcast and the other not-globally-reachable blocks of
// the IANA special-purpose registries (RFC 6890) are refused, and so is IPv6 outside global unicast 2000::/3. An
// IPv4-mapped (::ffff:0:0/96) or NAT64 (64:ff9b::/96) address is judged by the IPv4 address it carries; 6to4,
// Teredo and IPv4-compatible addresses are refused whatever they carry. The fetcher asks
// this for every address it is about to connect to, after DNS, so rebinding and redirects cannot reach a refused one.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"

namespace kestrel::media {

// Why an address is refused; kPublic is the only allowed class.
enum class AddressClass {
  kPublic,
  kUnspecified,   // 0.0.0.0/8 ("this network"), ::/128
  kLoopback,      // 127.0.0.0/8, ::1/128
  kPrivate,       // 10/8, 172.16/12, 192.168/16, fc00::/7
  kSharedCgnat,   // 100.64.0.0/10
  kLinkLocal,     // 169.254.0.0/16, fe80::/10
  kMulticast,     // 224.0.0.0/4, ff00::/8
  kReserved,      // the registry's other non-global blocks: documentation, benchmarking, 240/4, broadcast, ...
};

const char* address_class_name(AddressClass c);

// An IPv4 prefix. The fetcher's test-only exemption is one of these.
struct Ipv4Cidr {
  uint32_t base = 0;  // host order, host bits zero
  int prefix = 32;
  bool contains(uint32_t a) const { return prefix == 0 || (a >> (32 - prefix)) == (base >> (32 - prefix)); }
};

AddressClass classify_ipv4(uint32_t addr);  // host byte order
AddressClass classify_ipv6(const std::array<uint8_t, 16>& addr);

// Parses "a.b.c.d/n" (dotted quad, 0 <= n <= 32, host bits zero).
Result<Ipv4Cidr> parse_ipv4_cidr(std::string_view text);

struct AddressPolicy {
  // TEST-ONLY: one block inside 198.18.0.0/15 (RFC 2544's benchmarking range, refused by default) that is treated
  // as public, so a test can serve images from a network namespace. Set only by an explicit serve flag.
  std::optional<Ipv4Cidr> test_exempt;

  // kPublic when a connection to `sa` is allowed; other families are kReserved.
  AddressClass check(const sockaddr* sa, socklen_t len) const;
};

// The test-only exemption: parse_ipv4_cidr, then refused unless the block lies inside 198.18.0.0/15.
Result<Ipv4Cidr> parse_test_exempt_cidr(std::string_view text);

}  // namespace kestrel::media
