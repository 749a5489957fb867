#include "disagg/checksum.h"

// Debian libxxhash-dev's header, compiled here with this build's vector extensions. GCC 12 reports a false
// -Wmaybe-uninitialized inside its own avx512fintrin.h for XXH3's AVX-512 accumulate loop (the vector it names is
// a "don't care" operand of an intrinsic); this file holds nothing else.
#if defined(__GNUC__) && !defined(__clang__)  // clang knows no such warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kestrel::disagg {

struct Checksum::State {
  XXH3_state_t xxh;
};

Checksum::Checksum() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->xxh); }

Checksum::~Checksum() = default;

void Checksum::update(std::span<const std::byte> bytes) {
  if (!bytes.empty()) XXH3_64bits_update(&state_->xxh, bytes.data(), bytes.size());
}

uint64_t Checksum::value() const { return XXH3_64bits_digest(&state_->xxh); }

}  // namespace kestrel::disagg
