// The tokenizer that ships inside a K3 / Kimi Linear checkpoint directory: `tiktoken.model`
// (base64 token + rank per line) plus the special-token table of `tokenizer_config.json`
// (`added_tokens_decoder`), with the Kimi pre-tokenizer pattern and chunking caps.
#pragma once

#include <string>

#include "base/result.h"
#include "chat/tokenizer.h"

namespace kestrel::chat {

// Loads DIR/tiktoken.model and the specials from DIR/tokenizer_config.json (when the file lacks an
// added_tokens_decoder, the K3 table right after the ranks is used). A path to a regular file is read
// as GGUF (load_gguf_tokenizer).
Result<Tokenizer> load_model_tokenizer(const std::string& dir);

// The tokenizer inside a GGUF written by llama.cpp's converter for Kimi models: tokenizer.ggml.model
// "gpt2", tokenizer.ggml.pre "kimi-k2", tokenizer.ggml.tokens as GPT-2 byte-level strings (rank = id),
// tokenizer.ggml.token_type NORMAL (1) for ranks, CONTROL (3) / USER_DEFINED (4) for specials, UNUSED
// (5) padding skipped. Ranks must be ids 0..N-1. Merges are not needed (tiktoken BPE by rank gives
// the same merges the converter derived from the ranks). Kimi pattern and caps. Anything else (no
// tokenizer: model "none"; another pre-tokenizer) is an error naming the file and key.
Result<Tokenizer> load_gguf_tokenizer(const std::string& path);

// Writes a synthetic tokenizer in the K3 file format for a generated model of `vocab` ids (≥ 512):
// 256 single-byte ranks, then (vocab − 512) two-byte ranks (byte pairs in order), then K3's 256
// special/reserved slots (same names and order as K3) at ids vocab−256 .. vocab−1, like the release.
// Used by the embedded default and the benchmark presets (their weights are random anyway).
Status write_synthetic_k3_tokenizer(const std::string& dir, int vocab);

}  // namespace kestrel::chat
