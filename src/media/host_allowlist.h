// The domains a remote image fetch may name (docs/vision.md §3.3), from `kestrel serve --image-url-domains`:
// comma-separated entries, each an exact host name (`example.com`), a wildcard for its subdomains
// (`*.cdn.example`: `a.cdn.example` and `x.y.cdn.example`, not `cdn.example` itself) or an exact dotted-quad IPv4
// literal. Matching is on whole labels, case-insensitive, ignoring one trailing dot, so `evilexample.com` never
// matches `example.com` or `*.example.com`. The list decides which names may be asked for; which addresses may be
// connected to is media/address_policy's job, so an allowed name that resolves to a private address is still refused.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace kestrel::media {

class HostAllowList {
 public:
  // Refuses an empty list, empty entries, a bare `*`, a `*` anywhere but a leading `*.`, characters outside
  // letters, digits, '-' and '.', empty labels and IPv6 literals.
  static Result<HostAllowList> parse(std::string_view csv);

  bool allows(std::string_view host) const;
  const std::vector<std::string>& exact() const { return exact_; }
  const std::vector<std::string>& suffixes() const { return suffixes_; }  // "cdn.example" for "*.cdn.example"

 private:
  std::vector<std::string> exact_;
  std::vector<std::string> suffixes_;
};

}  // namespace kestrel::media
