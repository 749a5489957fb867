// The first token of a handed-off request and its logprobs as a fixed-size record, so that it travels with the
// state as one more registered range (one record per KDA slot on the decode side). Host byte order: both sides
// run the same build on the same architecture (the handshake fingerprint says so).
//   u32 magic 'KFT1' | i32 token | f32 logprob | u32 top count | 20 × (i32 id, f32 logprob)
#pragma once

#include <cstddef>
#include <span>

#include "base/result.h"
#include "scheduler/request.h"

namespace kestrel::pd {

inline constexpr size_t kMaxTop = 20;
inline constexpr size_t kRecordBytes = 16 + kMaxTop * 8;

// kInvalidArgument when the event has more than kMaxTop alternatives.
Status encode_first_token(const GenerationEvent& ev, std::span<std::byte, kRecordBytes> out);
// kCorrupt for a bad magic or count.
Result<GenerationEvent> decode_first_token(std::span<const std::byte, kRecordBytes> in);

}  // namespace kestrel::pd
