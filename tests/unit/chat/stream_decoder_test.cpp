#include "chat/stream_decoder.h"

#include <gtest/gtest.h>

#include <random>

#include "chat/utf8.h"
#include "test_util.h"

namespace kestrel::chat {
namespace {

Tokenizer bytes_only() {
  auto v = Vocab::parse(test::toy_vocab_text({"\xF0\x9F", "\x98\x80"}), "toy");  // emoji halves: 256, 257
  auto t = Tokenizer::create(std::move(*v), PreTokenizer::create(Pattern::kCl100k).value(), {}, std::nullopt);
  KCHECK(t.has_value(), "toy");
  return std::move(*t);
}

TEST(StreamDecoder, HoldsBackEmojiSplitAcrossTokens) {
  Tokenizer t = bytes_only();
  StreamDecoder d(t);
  EXPECT_EQ(*d.push('a'), "a");
  EXPECT_EQ(*d.push(256), "");  // F0 9F: incomplete, held back
  EXPECT_EQ(d.pending(), 2u);
  EXPECT_EQ(*d.push(257), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, ByteAtATime) {
  Tokenizer t = bytes_only();
  StreamDecoder d(t);
  const std::string s = "h\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x91\x8D!";  // h é 中 👍 !
  std::string out;
  for (char c : s) {
    const std::string piece = *d.push(static_cast<uint8_t>(c));
    EXPECT_TRUE(utf8_is_valid(piece));
    out += piece;
  }
  EXPECT_EQ(out + d.flush(), s);
}

TEST(StreamDecoder, InvalidBytes) {
  Tokenizer t = bytes_only();
  StreamDecoder d(t);
  EXPECT_EQ(d.push_bytes("\xFF"), "\xEF\xBF\xBD");          // can never start a sequence: at once
  EXPECT_EQ(d.push_bytes("\xE2\x82"), "");                  // could still complete
  EXPECT_EQ(d.push_bytes("A"), "\xEF\xBF\xBD" "A");         // now provably invalid: one U+FFFD
  EXPECT_EQ(d.push_bytes("\xED\xA0"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate lead: invalid at once
  EXPECT_EQ(d.push_bytes("\xF0\x9F\x98"), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");                     // truncated at end of stream
  EXPECT_EQ(d.pending(), 0u);
  EXPECT_FALSE(d.push(100000));
}

TEST(StreamDecoder, EqualsReplaceDecodingOfTheWhole) {
  Tokenizer t = bytes_only();
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    std::string all, out;
    StreamDecoder d(t);
    for (int k = rng() % 40; k > 0; --k) {
      std::string tok(1 + rng() % 3, '\0');
      for (char& c : tok) c = static_cast<char>(rng() % 3 ? 0x80 + rng() % 0x80 : rng() % 256);
      all += tok;
      const std::string piece = d.push_bytes(tok);
      EXPECT_TRUE(utf8_is_valid(piece));
      out += piece;
    }
    EXPECT_EQ(out + d.flush(), utf8_replace_invalid(all));
  }
}

TEST(StreamDecoder, RealVocabularyEmoji) {
  auto t = Tokenizer::create(cl100k_config(test::vocab_path("cl100k_base")));
  ASSERT_TRUE(t) << t.error().message();
  const std::string text = "family 👨‍👩‍👧‍👦 flag 🇯🇵 ok 🫠 中文";
  const auto ids = t->encode(text, SpecialMode::kAllow);
  StreamDecoder d(*t);
  std::string out;
  bool held = false;
  for (int32_t id : ids) {
    const std::string piece = *d.push(id);
    held |= d.pending() > 0;
    EXPECT_TRUE(utf8_is_valid(piece));
    out += piece;
  }
  EXPECT_TRUE(held) << "expected at least one emoji split across tokens";
  EXPECT_EQ(out + d.flush(), text);
}

}  // namespace
}  // namespace kestrel::chat
