#include "chat/model_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loader/gguf.h"

namespace kestrel::chat {
namespace fs = std::filesystem;

namespace {
std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}
}  // namespace

Result<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f) return f.error();
  const GgufHeader& h = f->header();
  auto str = [&](const char* key) -> std::string {
    const GgufValue* v = h.find(key);
    return v && !v->is_array() && v->as_string() ? *v->as_string() : std::string();
  };
  const std::string model = str("tokenizer.ggml.model"), pre = str("tokenizer.ggml.pre");
  if (model != "gpt2")
    return unsupported(path + ": key 'tokenizer.ggml.model' is '" + model +
                       "': this GGUF has no usable tokenizer (pass token ids with --prompt-ids)");
  if (pre != "kimi-k2")
    return unsupported(path + ": key 'tokenizer.ggml.pre' is '" + pre + "': only the Kimi pre-tokenizer (kimi-k2) is supported");
  const GgufValue* tokens = h.find("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array() || tokens->elem != GgufType::kString || tokens->size() == 0)
    return invalid_argument(path + ": key 'tokenizer.ggml.tokens': missing or not an array of strings");
  const GgufValue* types = h.find("tokenizer.ggml.token_type");
  if (types != nullptr && (!types->is_array() || types->size() != tokens->size()))
    return invalid_argument(path + ": key 'tokenizer.ggml.token_type': not an array as long as the token list");
  constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;
  std::string ranks;  // tiktoken text form: base64(byte-level string) SP rank, parsed below
  std::vector<SpecialToken> specials;
  int32_t n_ranks = 0;
  for (size_t id = 0; id < tokens->size(); ++id) {
    const int64_t type = types ? types->as_int(id).value_or(-1) : kNormal;
    const std::string& text = tokens->str[id];
    if (type == kNormal) {
      if (static_cast<int32_t>(id) != n_ranks)
        return unsupported(path + ": token " + std::to_string(id) + " is a normal token after a special one: ranks must be ids 0..N-1");
      ranks += base64(text) + " " + std::to_string(n_ranks++) + "\n";
    } else if (type == kControl || type == kUserDefined) {
      specials.push_back({text, static_cast<int32_t>(id)});
    } else if (type != kUnused) {
      return unsupported(path + ": token " + std::to_string(id) + " has token type " + std::to_string(type) +
                         " (normal, control, user-defined and unused are supported)");
    }
  }
  auto vocab = Vocab::parse(ranks, path + " tokenizer.ggml.tokens", VocabFormat::kGpt2ByteLevel);
  if (!vocab) return vocab.error();
  auto pretok = PreTokenizer::create(Pattern::kKimi);
  if (!pretok) return pretok.error();
  return Tokenizer::create(std::move(*vocab), std::move(*pretok), std::move(specials), ChunkCaps{});
}

Result<Tokenizer> load_model_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return load_gguf_tokenizer(dir);
  const std::string vocab = (fs::path(dir) / "tiktoken.model").string();
  if (!fs::exists(vocab)) return not_found(dir + ": no tiktoken.model (the tokenizer ships with the checkpoint)");
  TokenizerConfig cfg = kimi_k3_config(vocab);
  const fs::path tc = fs::path(dir) / "tokenizer_config.json";
  bool have_table = false;
  if (fs::exists(tc)) {
    std::ifstream in(tc);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument(tc.string() + ": not valid JSON");
    if (j.contains("added_tokens_decoder")) {
      const auto& d = j["added_tokens_decoder"];
      if (!d.is_object()) return invalid_argument(tc.string() + ": added_tokens_decoder is not an object");
      cfg.specials.clear();
      for (auto it = d.begin(); it != d.end(); ++it) {
        char* end = nullptr;
        const long id = std::strtol(it.key().c_str(), &end, 10);
        if (*end != '\0' || id < 0 || id > (1 << 24) || !it.value().is_object() || !it.value().contains("content") ||
            !it.value()["content"].is_string())
          return invalid_argument(tc.string() + ": bad added_tokens_decoder entry '" + it.key() + "'");
        cfg.specials.push_back({it.value()["content"].get<std::string>(), static_cast<int32_t>(id)});
      }
      have_table = true;
    }
  }
  if (!have_table) {
    // Same as the release: specials start right after the last rank.
    auto probe = Tokenizer::create(TokenizerConfig{vocab, VocabFormat::kRawBytes, Pattern::kKimi, ChunkCaps{}, {}});
    if (!probe) return probe.error();
    cfg.specials = kimi_k3_specials(probe->num_ranks());
  }
  return Tokenizer::create(cfg);
}

Status write_synthetic_k3_tokenizer(const std::string& dir, int vocab) {
  if (vocab < 512 || vocab - 512 > 65536) return invalid_argument("synthetic tokenizer: vocab must be in 512..66048");
  std::ofstream v(fs::path(dir) / "tiktoken.model");
  for (int b = 0; b < 256; ++b) v << base64(std::string(1, static_cast<char>(b))) << " " << b << "\n";
  for (int i = 0; i < vocab - 512; ++i)
    v << base64(std::string{static_cast<char>(i / 256), static_cast<char>(i % 256)}) << " " << 256 + i << "\n";
  if (!v) return io_error(dir + ": cannot write tiktoken.model");
  nlohmann::json added = nlohmann::json::object();
  for (const auto& s : kimi_k3_specials(vocab - 256))
    added[std::to_string(s.id)] = {{"content", s.text}, {"special", true}};
  nlohmann::json cfg = {{"tokenizer_class", "TikTokenTokenizer"}, {"added_tokens_decoder", added},
                        {"bos_token", "[BOS]"}, {"eos_token", "<|end_of_msg|>"}, {"pad_token", "[PAD]"},
                        {"model_max_length", 1048576}};
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << cfg.dump(2) << "\n";
  return Status::ok();
}

}  // namespace kestrel::chat
