#include "media/host_allowlist.h"

#include <algorithm>
#include <cctype>

namespace kestrel::media {
namespace {

std::string lower_host(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  size_t label = 0;
  for (char c : name) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    if (++label > 63) return false;
  }
  return label > 0;
}

}  // namespace

Result<HostAllowList> HostAllowList::parse(std::string_view csv) {
  HostAllowList out;
  size_t start = 0;
  while (start <= csv.size()) {
    const size_t comma = std::min(csv.find(',', start), csv.size());
    const std::string entry = lower_host(csv.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) return invalid_argument("empty entry in the domain list");
    if (entry.find(':') != std::string::npos)
      return invalid_argument("'" + entry + "': IPv6 literals are not supported in the domain list");
    const bool wildcard = entry.rfind("*.", 0) == 0;
    const std::string name = wildcard ? entry.substr(2) : entry;
    if (!valid_name(name))
      return invalid_argument("'" + entry + "' is not a host name, '*.' + a host name, or an IPv4 address");
    (wildcard ? out.suffixes_ : out.exact_).push_back(name);
  }
  return out;
}

bool HostAllowList::allows(std::string_view host) const {
  const std::string h = lower_host(host);
  if (!valid_name(h)) return false;
  for (const std::string& e : exact_)
    if (h == e) return true;
  for (const std::string& s : suffixes_)
    if (h.size() > s.size() + 1 && h.compare(h.size() - s.size(), s.size(), s) == 0 && h[h.size() - s.size() - 1] == '.')
      return true;
  return false;
}

}  // namespace kestrel::media
