// libFuzzer target: the GGUF parser (and the metadata → ModelConfig translation on what it accepts) on
// arbitrary bytes must never crash, hang or read out of bounds (ASan+UBSan in the fuzz preset).
#include <cstddef>
#include <cstdint>
#include <span>

#include "loader/gguf.h"
#include "loader/gguf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = kestrel::parse_gguf(std::span<const uint8_t>(data, size), "fuzz");
  if (r) {
    // Every accepted tensor lies inside the buffer, aligned, with a known type.
    for (const auto& t : r->tensors) {
      if (r->data_start + t.offset + t.nbytes > size || t.offset % r->alignment != 0) __builtin_trap();
      if (!kestrel::ggml_type_traits(static_cast<uint32_t>(t.type))) __builtin_trap();
    }
    auto c = kestrel::model_config_from_gguf(*r, "fuzz");
    (void)c;
  }
  return 0;
}
