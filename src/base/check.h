// KCHECK: invariant checks that are never compiled out. Input errors must use Result/Status instead.
#pragma once

#include <string_view>

namespace kestrel {

// __builtin_FILE/LINE instead of std::source_location: clang 14 (the fuzz build) lacks the latter
// with libstdc++ 12.
[[noreturn]] void panic(std::string_view message, const char* file = __builtin_FILE(), int line = __builtin_LINE());

}  // namespace kestrel

#define KCHECK(cond, msg)                                  \
  do {                                                     \
    if (!(cond)) ::kestrel::panic(std::string_view(msg));  \
  } while (0)
