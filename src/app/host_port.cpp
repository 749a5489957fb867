#include "app/host_port.h"

namespace kestrel::app {

Result<HostPort> parse_host_port(std::string_view s) {
  auto bad = [&] { return invalid_argument("'" + std::string(s) + "' is not HOST:PORT (e.g. 127.0.0.1:6379)"); };
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos) return bad();
  std::string_view host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return bad();  // an IPv6 address needs brackets
  }
  if (host.empty() || port.empty() || port.size() > 5) return bad();
  for (char c : host)
    if (c == '[' || c == ']' || c == '/' || c == ' ' || static_cast<unsigned char>(c) < 0x21) return bad();
  int p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return bad();
    p = p * 10 + (c - '0');
  }
  if (p < 1 || p > 65535) return bad();
  return HostPort{std::string(host), p};
}

}  // namespace kestrel::app
