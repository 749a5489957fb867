// Where the tests find the real tiktoken vocabularies (cl100k_base, o200k_base, llama3, deepseek_v3, kimi_k3).
// tools/extract_vocabs.py rebuilds them from the splintr-rs package and checks each against its published hash;
// scripts/test.sh writes them to build/vocab, which is the default of the CMake cache variable KESTREL_VOCAB_DIR
// (compiled in as KESTREL_TIKTOKEN_DIR). The environment variable KESTREL_TIKTOKEN_DIR overrides it at run time.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kestrel::testing {

inline std::string vocab_dir() {
  if (const char* e = std::getenv("KESTREL_TIKTOKEN_DIR")) return e;
  return KESTREL_TIKTOKEN_DIR;
}

// Path of vocabulary `name` (e.g. "cl100k_base"); says on stderr how to make it when it is missing, so the
// loader's "cannot open" that follows is not the only clue.
inline std::string vocab_file(const std::string& name) {
  std::string path = vocab_dir() + "/" + name + ".tiktoken";
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "%s is missing: run tools/extract_vocabs.py --out-dir %s (scripts/test.sh does)\n",
                 path.c_str(), vocab_dir().c_str());
  }
  return path;
}

}  // namespace kestrel::testing
