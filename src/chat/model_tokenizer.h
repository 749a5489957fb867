// The tokenizer that ships inside a K3 / Kimi Linear checkpoint directory: `tiktoken.model`
// (base64 token + rank per line) plus the special-token table of `tokenizer_config.json`
// (`added_tokens_decoder`), with the Kimi pre-tokenizer pattern and chunking caps.
#pragma once

#include <string>

#include "base/result.h"
#include "chat/tokenizer.h"

namespace kestrel::chat {

// Loads DIR/tiktoken.model and the specials from DIR/tokenizer_config.json (when the file lacks an
// added_tokens_decoder, the K3 table right after the ranks is used).
Result<Tokenizer> load_model_tokenizer(const std::string& dir);

// Writes a byte-level tokenizer in the K3 file format: 256 single-byte ranks, then K3's 256
// special/reserved slots (same names and order as K3, ids 256..511). Used by the embedded default.
Status write_byte_level_k3_tokenizer(const std::string& dir);

}  // namespace kestrel::chat
