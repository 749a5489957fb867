#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace kestrel {

void panic(std::string_view message, std::source_location where) {
  std::fprintf(stderr, "kestrel: internal error at %s:%u: %.*s\n", where.file_name(),
               static_cast<unsigned>(where.line()), static_cast<int>(message.size()), message.data());
  std::abort();
}

}  // namespace kestrel
