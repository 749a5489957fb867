// tokenizer_bench: single-thread encode throughput of kestrel::chat::Tokenizer on a text file.
//   tokenizer_bench --vocab FILE --pattern kimi|cl100k|o200k|llama3|deepseek_v3 --input TEXT [--repeat N]
// Prints "<MB/s best of N> <id count>" on stdout. tools/tokenizer_bench.py runs tiktoken on the same text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "chat/tokenizer.h"

int main(int argc, char** argv) {
  using namespace kestrel::chat;
  std::string vocab, pattern = "cl100k", input;
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--vocab") vocab = v;
    else if (a == "--pattern") pattern = v;
    else if (a == "--input") input = v;
    else if (a == "--repeat") repeat = std::max(1, std::atoi(v.c_str()));
  }
  const auto p = pattern_from_name(pattern);
  if (vocab.empty() || input.empty() || !p) {
    std::fprintf(stderr, "usage: tokenizer_bench --vocab FILE --pattern NAME --input TEXT [--repeat N]\n");
    return 2;
  }
  TokenizerConfig config{vocab, VocabFormat::kRawBytes, *p, std::nullopt, {}};
  if (*p == Pattern::kKimi) config.caps = ChunkCaps{};
  if (*p == Pattern::kDeepSeekV3) config.vocab_format = VocabFormat::kGpt2ByteLevel;
  auto tok = Tokenizer::create(config);
  if (!tok) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", tok.error().message().c_str());
    return 1;
  }
  std::ifstream f(input, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  double best = 1e30;
  size_t n = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    n = tok->encode(text, SpecialMode::kAsText).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("%.3f %zu\n", text.size() / 1e6 / best, n);
  return 0;
}
