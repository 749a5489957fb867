#include "server/stop_matcher.h"

#include <algorithm>

namespace kestrel::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t p = buf.find(s);
    if (p < best) {
      best = p;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    buf.resize(best);
    return buf;
  }
  // Hold back the longest suffix of buf that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(buf.size(), s.size() - 1); k > hold; --k) {
      if (std::string_view(buf).substr(buf.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  held_ = buf.substr(buf.size() - hold);
  buf.resize(buf.size() - hold);
  return buf;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kestrel::server
