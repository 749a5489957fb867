// Deadline: a point on the steady clock that every wait in disagg/ is bounded by.
#pragma once

#include <chrono>

namespace kestrel::disagg {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  static Deadline after(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }

 private:
  Clock::time_point at_;
};

}  // namespace kestrel::disagg
