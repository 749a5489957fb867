// The tokenizer read from a GGUF (tokenizer.ggml.*, as llama.cpp's converter writes Kimi's) against
// llama.cpp's own tokenizer on the same file: tests/data/gguf/tokenizer_cl100k4k.{gguf,json}, made by
// tools/gen_gguf_goldens.py (first 4096 cl100k_base ranks + six Kimi specials, pre-tokenizer kimi-k2).
// Ids must be identical, with special-token strings as text and as specials; decode must round-trip.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "chat/model_tokenizer.h"

namespace kestrel::chat {
namespace {

const std::string kDir = KESTREL_TEST_DATA "/gguf/";

TEST(GgufTokenizer, MatchesLlamaCppOnTheSameFile) {
  auto tok = load_model_tokenizer(kDir + "tokenizer_cl100k4k.gguf");  // a file path → GGUF
  ASSERT_TRUE(tok) << tok.error().message();
  EXPECT_EQ(tok->num_ranks(), 4096);
  EXPECT_EQ(tok->special_id("<|im_end|>"), 4098);
  std::ifstream in(kDir + "tokenizer_cl100k4k.json");
  const auto j = nlohmann::json::parse(in);
  int n = 0;
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok->encode(text, SpecialMode::kAsText), c["ids_as_text"].get<std::vector<int32_t>>()) << text;
    const auto allow = tok->encode(text, SpecialMode::kAllow);
    EXPECT_EQ(allow, c["ids_allow_special"].get<std::vector<int32_t>>()) << text;
    auto back = tok->decode(allow);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, text);
    ++n;
  }
  EXPECT_GE(n, 20);
}

TEST(GgufTokenizer, NoTokenizerIsAClearError) {
  auto tok = load_model_tokenizer(kDir + "k3_micro_q8_0.gguf");
  ASSERT_FALSE(tok);
  const std::string m = tok.error().message();
  EXPECT_NE(m.find("k3_micro_q8_0.gguf"), std::string::npos) << m;
  EXPECT_NE(m.find("tokenizer.ggml.model"), std::string::npos) << m;
  EXPECT_NE(m.find("--prompt-ids"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

}  // namespace
}  // namespace kestrel::chat
