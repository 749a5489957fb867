// Small text predicates shared by the chat renderers.
#pragma once

#include <string_view>

namespace kestrel::chat {

// True if `s` (UTF-8) is empty or only Python-str.isspace() characters, i.e. `not s.strip()` in Python.
// Invalid UTF-8 bytes count as non-space.
bool is_py_whitespace_only(std::string_view s);

}  // namespace kestrel::chat
