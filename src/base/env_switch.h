// A process-wide on/off switch: read from an environment variable on first use, settable in code
// (set() wins over the variable). Default off: "1" turns it on; default on: "0" turns it off.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kestrel {

class EnvSwitch {
 public:
  constexpr EnvSwitch(const char* name, bool default_on) : name_(name), default_on_(default_on) {}

  bool on() const {
    int v = v_.load(std::memory_order_relaxed);
    if (v < 0) {
      const char* e = std::getenv(name_);
      v = e == nullptr ? default_on_ : default_on_ ? std::strcmp(e, "0") != 0 : std::strcmp(e, "1") == 0;
      v_.store(v, std::memory_order_relaxed);
    }
    return v == 1;
  }
  void set(bool on) { v_.store(on ? 1 : 0, std::memory_order_relaxed); }

 private:
  const char* name_;
  bool default_on_;
  mutable std::atomic<int> v_{-1};  // -1: not read yet
};

}  // namespace kestrel
