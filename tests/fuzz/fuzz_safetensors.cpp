// libFuzzer target: the safetensors header parser on arbitrary bytes must never crash, hang or
// read out of bounds (built with ASan+UBSan in the fuzz preset).
#include <cstddef>
#include <cstdint>
#include <span>

#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = kestrel::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
  if (r) {
    // Every accepted entry must lie inside the buffer.
    for (const auto& e : r->entries)
      if (r->data_start + e.end > size) __builtin_trap();
  }
  return 0;
}
