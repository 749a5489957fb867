#include "pd/first_token.h"

#include <cstdint>
#include <cstring>

namespace kestrel::pd {
namespace {

constexpr uint32_t kMagic = 0x3154464b;  // "KFT1"

template <typename T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

Status encode_first_token(const GenerationEvent& ev, std::span<std::byte, kRecordBytes> out) {
  if (ev.top.size() > kMaxTop) return invalid_argument("first token: more than 20 top logprobs");
  std::memset(out.data(), 0, out.size());
  put<uint32_t>(out.data(), kMagic);
  put<int32_t>(out.data() + 4, ev.token);
  put<float>(out.data() + 8, ev.logprob);
  put<uint32_t>(out.data() + 12, static_cast<uint32_t>(ev.top.size()));
  for (size_t i = 0; i < ev.top.size(); ++i) {
    put<int32_t>(out.data() + 16 + 8 * i, ev.top[i].id);
    put<float>(out.data() + 20 + 8 * i, ev.top[i].logprob);
  }
  return Status();
}

Result<GenerationEvent> decode_first_token(std::span<const std::byte, kRecordBytes> in) {
  if (get<uint32_t>(in.data()) != kMagic) return corrupt("first token: bad record magic");
  const uint32_t n = get<uint32_t>(in.data() + 12);
  if (n > kMaxTop) return corrupt("first token: bad top count");
  GenerationEvent ev;
  ev.token = get<int32_t>(in.data() + 4);
  ev.logprob = get<float>(in.data() + 8);
  for (uint32_t i = 0; i < n; ++i)
    ev.top.push_back({get<int32_t>(in.data() + 16 + 8 * i), get<float>(in.data() + 20 + 8 * i)});
  return ev;
}

}  // namespace kestrel::pd
