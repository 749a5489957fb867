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

// Writes a synthetic tokenizer in the K3 file format for a generated model of `vocab` ids (≥ 512):
// 256 single-byte ranks, then (vocab − 512) two-byte ranks (byte pairs in order), then K3's 256
// special/reserved slots (same names and order as K3) at ids vocab−256 .. vocab−1, like the release.
// Used by the embedded default and the benchmark presets (their weights are random anyway).
Status write_synthetic_k3_tokenizer(const std::string& dir, int vocab);

}  // namespace kestrel::chat
