// libFuzzer target for the streaming output parser (model output is untrusted bytes).
// Byte 0 picks the format and start channel, byte 1 the chunk size. Checks: no crash / sanitizer report, and the
// same fields whether the input arrives whole or in chunks.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "chat/output_parser.h"

using namespace kestrel::chat;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  OutputParserOptions o;
  o.format = (data[0] & 1) ? OutputFormat::kKimiK2 : OutputFormat::kKimiK3;
  o.starts_in_reasoning = (data[0] & 2) != 0;
  const size_t chunk = 1 + data[1] % 17;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  OutputParser whole(o);
  ParseDelta a = whole.push(text);
  a.append(whole.finish());

  OutputParser parts(o);
  ParseDelta b;
  for (size_t i = 0; i < text.size(); i += chunk) b.append(parts.push(text.substr(i, chunk)));
  b.append(parts.finish());

  if (a.content != b.content || a.reasoning_content != b.reasoning_content || !(a.tool_calls == b.tool_calls) ||
      a.finished != b.finished)
    std::abort();
  return 0;
}
