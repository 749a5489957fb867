// HOST:PORT as a flag value (--prefix-cache-redis): a host name or IPv4 address, or a bracketed IPv6 address
// ([::1]:6379), then a port in 1..65535.
#pragma once

#include <string>
#include <string_view>

#include "base/result.h"

namespace kestrel::app {

struct HostPort {
  std::string host;
  int port = 0;
};

Result<HostPort> parse_host_port(std::string_view s);

}  // namespace kestrel::app
