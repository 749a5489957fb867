// libFuzzer target: OpenAI request parsing + validation (chat, completions, tokenize, detokenize) on arbitrary
// bytes. Contract under test: no crash, no UB, no exception escapes, bounded work for any input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/openai_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel::server;
  static const SchemaLimits limits = [] {
    SchemaLimits l;
    l.served_model = "kimi-k3";
    return l;
  }();
  std::string_view body(reinterpret_cast<const char*>(data), size);
  (void)parse_chat_request(body, limits);
  (void)parse_completion_request(body, limits);
  (void)parse_tokenize_request(body, limits);
  (void)parse_detokenize_request(body, limits);
  return 0;
}
