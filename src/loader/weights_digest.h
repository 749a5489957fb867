// A digest of a model's files by content, independent of where they sit: what the prefix cache's persistent and
// shared tiers (disk, Redis) bind their objects to, so two servers, or one server after a restart, that load the
// same bytes from different paths share cached prefixes, and a model whose bytes changed never reuses them.
//
//   digest = SHA-256(field("kestrel-weights-v1") || for each file, by name: field(name) || SHA-256(file bytes))
//            field(s) = u64 little-endian length || bytes
//
// The files are every regular file of the model directory (symlinks followed, not recursive), named relative to it;
// a single-file model (a GGUF) is that file with an empty name, so renaming it keeps the digest. Hashing reads every
// byte once (files in parallel); the result per file is remembered in `memo_dir` under the file's canonical path,
// its size, modification time, inode and device, so a restart of the same files costs no reads. A memo entry that
// does not parse or does not match is ignored and rewritten.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"

namespace kestrel {

struct WeightsDigest {
  std::string hex;           // 64 lower-case hex characters
  int64_t files = 0;
  int64_t bytes = 0;         // bytes of all files
  int64_t hashed_bytes = 0;  // bytes read this time (the rest came from the memo)
  double seconds = 0;
};

// `memo_dir` empty: no memo (every byte is read). Errors: the model path is missing or unreadable.
Result<WeightsDigest> weights_digest(const std::string& model_path, const std::string& memo_dir);

}  // namespace kestrel
