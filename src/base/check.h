// KCHECK: invariant checks that are never compiled out. Input errors must use Result/Status instead.
#pragma once

#include <source_location>
#include <string_view>

namespace kestrel {

[[noreturn]] void panic(std::string_view message,
                        std::source_location where = std::source_location::current());

}  // namespace kestrel

#define KCHECK(cond, msg)                                  \
  do {                                                     \
    if (!(cond)) ::kestrel::panic(std::string_view(msg));  \
  } while (0)
