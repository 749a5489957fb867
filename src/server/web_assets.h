// The chat page served at `/` (src/server/web: chat.html, chat.js, chat.css), compiled into the binary by
// CMake (web/embed.cmake): no files are read at run time.
#pragma once

#include <span>
#include <string_view>

namespace kestrel::server {

struct WebAsset {
  std::string_view path;          // "/" for chat.html, "/chat.js", "/chat.css"
  std::string_view content_type;  // with charset
  std::string_view body;
};

std::span<const WebAsset> web_assets();

// The Content-Security-Policy the page is served with: scripts, styles and fetches from this origin only,
// no inline code, no frames, no plugins.
inline constexpr std::string_view kWebCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace kestrel::server
