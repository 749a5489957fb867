// StreamDecoder: turns ids arriving one at a time into UTF-8 text as soon as it is complete.
//
// Rule: pending bytes are scanned from the front. A complete well-formed sequence is emitted verbatim. A
// maximal invalid subpart (Unicode §3.9) that is *provably* invalid — a byte that can never start a sequence,
// or a lead byte followed by a byte that cannot continue it — is emitted as one U+FFFD. A trailing lead byte
// plus valid continuations that the next token could still complete is held back. flush() (end of stream)
// emits any held-back bytes as one U+FFFD. No byte is ever dropped, and the concatenated output of all push()
// calls plus flush() equals bytes.decode("utf-8", errors="replace") of the concatenated token bytes.
// Not thread-safe (one decoder per stream); the Tokenizer it reads must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"
#include "chat/tokenizer.h"

namespace kestrel::chat {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Returns the text completed by this id (possibly empty). Unknown ids are an error and change nothing.
  Result<std::string> push(int32_t id);
  // Same, for raw bytes (used by push; exposed for tests).
  std::string push_bytes(std::string_view bytes);
  // End of stream: returns held-back bytes as U+FFFD (empty if none) and resets.
  std::string flush();
  // Bytes held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace kestrel::chat
