#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace kestrel {

void panic(std::string_view message, const char* file, int line) {
  std::fprintf(stderr, "kestrel: internal error at %s:%d: %.*s\n", file, line, static_cast<int>(message.size()),
               message.data());
  std::abort();
}

}  // namespace kestrel
