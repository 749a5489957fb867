// StopMatcher: finds OpenAI `stop` strings in streamed text that arrives in arbitrary pieces.
//
// push() returns the text that can be emitted now: everything before the earliest stop string once one
// appears (then stopped() is true and the stop string and anything after it are dropped), otherwise
// everything except the longest suffix that could still grow into a stop string (held back). flush() returns
// the held-back text at end of stream. Input must be valid UTF-8; output then is too (a held-back suffix starts
// at a stop string's first byte, a character boundary). Not thread-safe; one per choice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kestrel::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that ended the text

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace kestrel::server
