// tokenize_cli: test driver for tools/tokenizer_parity.py and tools/tokenizer_bench.py.
//
//   tokenize_cli --gguf FILE (tokenizer.ggml.* of a GGUF, see load_gguf_tokenizer) [--mode ...] --input ... --output ...
//   tokenize_cli --vocab FILE [--preset kimi|cl100k|o200k|llama3|deepseek_v3] [--pattern NAME]
//                [--byte-level] [--kimi-caps] [--specials FILE] [--mode allow|text] [--bytes]
//                --input DOCS --output IDS [--roundtrip] [--repeat N]
//
// DOCS: repeated (u32 little-endian length, bytes). IDS: per document (u32 count, count x i32), little-endian.
// --specials FILE: lines "id<TAB>text", replacing the preset's table. --bytes uses encode_bytes().
// --roundtrip checks decode(encode(doc)) == doc (== doc with U+FFFD repair unless --bytes).
// Prints encode throughput (MB/s, one thread, best of --repeat) on stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "chat/model_tokenizer.h"
#include "chat/tokenizer.h"
#include "chat/utf8.h"

namespace {

using namespace kestrel::chat;

int fail(const std::string& m) {
  std::fprintf(stderr, "tokenize_cli: %s\n", m.c_str());
  return 2;
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string gguf, vocab, preset = "cl100k", pattern, specials_path, mode = "allow", input, output;
  bool byte_level = false, kimi_caps = false, use_bytes = false, roundtrip = false;
  int repeat = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--vocab") vocab = next();
    else if (a == "--gguf") gguf = next();
    else if (a == "--preset") preset = next();
    else if (a == "--pattern") pattern = next();
    else if (a == "--specials") specials_path = next();
    else if (a == "--mode") mode = next();
    else if (a == "--input") input = next();
    else if (a == "--output") output = next();
    else if (a == "--byte-level") byte_level = true;
    else if (a == "--kimi-caps") kimi_caps = true;
    else if (a == "--bytes") use_bytes = true;
    else if (a == "--roundtrip") roundtrip = true;
    else if (a == "--repeat") repeat = std::max(1, std::atoi(next().c_str()));
    else return fail("unknown argument " + a);
  }
  if ((vocab.empty() && gguf.empty()) || input.empty()) return fail("need --vocab (or --gguf) and --input");

  TokenizerConfig config;
  if (preset == "kimi") config = kimi_k3_config(vocab);
  else if (preset == "cl100k") config = cl100k_config(vocab);
  else if (preset == "o200k") config = o200k_config(vocab);
  else if (preset == "llama3") config = llama3_config(vocab);
  else if (preset == "deepseek_v3") config = deepseek_v3_config(vocab);
  else return fail("unknown preset " + preset);
  if (!pattern.empty()) {
    const auto p = pattern_from_name(pattern);
    if (!p) return fail("unknown pattern " + pattern);
    config.pattern = *p;
  }
  if (byte_level) config.vocab_format = VocabFormat::kGpt2ByteLevel;
  if (kimi_caps) config.caps = ChunkCaps{};
  if (!specials_path.empty()) {
    std::string text;
    if (!read_file(specials_path, &text)) return fail("cannot read " + specials_path);
    config.specials.clear();
    std::istringstream ss(text);
    std::string line;
    while (std::getline(ss, line)) {
      const size_t tab = line.find('\t');
      if (tab == std::string::npos) continue;
      config.specials.push_back({line.substr(tab + 1), std::atoi(line.substr(0, tab).c_str())});
    }
  }
  if (mode != "allow" && mode != "text") return fail("--mode must be allow or text");
  const SpecialMode smode = mode == "allow" ? SpecialMode::kAllow : SpecialMode::kAsText;

  auto tok = gguf.empty() ? Tokenizer::create(config) : load_gguf_tokenizer(gguf);
  if (!tok) return fail(tok.error().message());

  std::string blob;
  if (!read_file(input, &blob)) return fail("cannot read " + input);
  std::vector<std::string_view> docs;
  for (size_t pos = 0; pos + 4 <= blob.size();) {
    uint32_t n;
    std::memcpy(&n, blob.data() + pos, 4);
    pos += 4;
    if (pos + n > blob.size()) return fail("truncated input");
    docs.emplace_back(blob.data() + pos, n);
    pos += n;
  }

  std::vector<std::vector<int32_t>> ids(docs.size());
  double best = 1e30;
  size_t total_bytes = 0;
  for (auto d : docs) total_bytes += d.size();
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < docs.size(); ++i) {
      ids[i] = use_bytes ? tok->encode_bytes(docs[i], smode) : tok->encode(docs[i], smode);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  size_t total_ids = 0;
  for (auto& v : ids) total_ids += v.size();
  std::fprintf(stderr, "tokenize_cli: %zu docs, %.2f MB, %zu ids, encode %.3f s = %.2f MB/s\n", docs.size(),
               total_bytes / 1e6, total_ids, best, total_bytes / 1e6 / best);

  int bad = 0;
  if (roundtrip) {
    for (size_t i = 0; i < docs.size(); ++i) {
      auto back = tok->decode(ids[i]);
      const std::string want = use_bytes ? std::string(docs[i]) : utf8_replace_invalid(docs[i]);
      if (!back || *back != want) {
        if (bad++ < 5) std::fprintf(stderr, "tokenize_cli: round trip failed for doc %zu\n", i);
      }
    }
  }
  if (!output.empty()) {
    std::ofstream f(output, std::ios::binary);
    for (auto& v : ids) {
      const uint32_t n = static_cast<uint32_t>(v.size());
      f.write(reinterpret_cast<const char*>(&n), 4);
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    }
    if (!f) return fail("cannot write " + output);
  }
  return bad == 0 ? 0 : 1;
}
