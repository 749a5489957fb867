// Byte-pair encoding of one pre-tokenized piece by merge rank, with tiktoken's exact semantics:
// a piece that is itself a token is that token; otherwise start from single bytes and repeatedly merge the
// adjacent pair whose concatenation has the lowest rank (leftmost on ties) until no pair is a token.
// Short pieces use tiktoken's linear rescan; long ones a min-heap over a linked list, O(n log n).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "chat/vocab.h"

namespace kestrel::chat {

// Appends the ids of `piece` to `out`. Requires every single byte of `piece` to be a mergeable token
// (Tokenizer::create checks all 256).
void bpe_encode(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out);

}  // namespace kestrel::chat
