// libFuzzer target: the prefix cache's tier object parser (cache/tier_object.h) on arbitrary bytes, as a disk file
// or a shared Redis value could hold them. Random bytes almost never carry a valid SHA-256, so each input is also
// parsed re-sealed (its trailer replaced by the checksum of the rest, the identity taken from its own header):
// that reaches the checks behind the checksum. Whatever parses must serialise back to the same bytes.
#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cache/tier_object.h"

namespace {

void check_round_trip(const std::vector<uint8_t>& bytes, const kestrel::Result<kestrel::TierObject>& r) {
  if (r && kestrel::serialize_tier_object(*r) != bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel;
  const std::vector<uint8_t> raw(data, data + size);
  const Digest key = tier_store_key(Digest{}, TierPayloadKind::kPages);
  check_round_trip(raw, parse_tier_object(raw, key, model_digest("fuzz"), TierPayloadKind::kPages));
  if (size < kTierObjectHeaderBytes + kTierObjectTrailerBytes) return 0;
  std::vector<uint8_t> sealed = raw;
  const size_t body = size - kTierObjectTrailerBytes;
  unsigned int len = 0;
  if (EVP_Digest(sealed.data(), body, sealed.data() + body, &len, EVP_sha256(), nullptr) != 1) std::abort();
  Digest own_key, own_model;
  std::memcpy(own_key.data(), sealed.data() + 16, 32);
  std::memcpy(own_model.data(), sealed.data() + 48, 32);
  for (auto kind : {TierPayloadKind::kPages, TierPayloadKind::kSnapshot})
    check_round_trip(sealed, parse_tier_object(sealed, own_key, own_model, kind));
  return 0;
}
