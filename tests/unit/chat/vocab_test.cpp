#include <gtest/gtest.h>

#include "chat/vocab.h"
#include "test_util.h"

namespace kestrel::chat {
namespace {

using test::b64;

TEST(Vocab, ParsesRanksAndBytes) {
  auto v = Vocab::parse(b64("a") + " 0\n" + b64("b") + " 1\n\n" + b64("ab") + " 2\r\n", "t");
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v->size(), 3);
  EXPECT_EQ(v->bytes(2), "ab");
  EXPECT_EQ(v->rank("ab"), 2);
  EXPECT_EQ(v->rank("b"), 1);
  EXPECT_EQ(v->rank("ba"), -1);
  EXPECT_EQ(v->rank("abc"), -1);
}

TEST(Vocab, LongTokensUseHashIndex) {
  auto v = Vocab::parse(b64("hello") + " 0\n" + b64("hello world, long token") + " 1\n", "t");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->rank("hello world, long token"), 1);
  EXPECT_EQ(v->rank("hello"), 0);
  EXPECT_EQ(v->rank("hellp"), -1);
}

void expect_error(const std::string& text, const std::string& needle) {
  auto v = Vocab::parse(text, "vocab.tiktoken");
  ASSERT_FALSE(v) << "accepted: " << text;
  EXPECT_NE(v.error().message().find(needle), std::string::npos) << v.error().message();
}

TEST(Vocab, RejectsMalformedFiles) {
  expect_error(b64("a") + " 0\nYQ=! 1\n", "vocab.tiktoken:2: bad base64");
  expect_error(b64("a") + " 0\nYQ 1\n", "vocab.tiktoken:2: bad base64");     // unpadded
  expect_error(b64("a") + " 0\nYR== 1\n", "vocab.tiktoken:2: bad base64");   // non-canonical bits
  expect_error(b64("a") + " 0\n" + b64("b") + " 0\n", "vocab.tiktoken:2: duplicate rank 0 (first on line 1)");
  expect_error(b64("a") + " 0\n" + b64("a") + " 1\n", "vocab.tiktoken:2: duplicate token");
  expect_error(b64("a") + " 0\n" + b64("b") + " 2\n", "rank 1 is missing");
  expect_error(b64("a") + " x\n", "vocab.tiktoken:1: bad rank");
  expect_error(b64("a") + " -1\n", "vocab.tiktoken:1: bad rank");
  expect_error(b64("a") + "0\n", "vocab.tiktoken:1: expected");
  expect_error(b64("a") + " 0 1\n", "vocab.tiktoken:1: expected");
  expect_error("", "no tokens");
}

TEST(Vocab, RejectsHugeRankWithoutAllocating) {
  // Found by fuzz_tokenizer: a single rank near 2^30 used to size the rank table first.
  auto v = Vocab::parse(b64("a") + " 1002000000\n", "t");
  ASSERT_FALSE(v);
  EXPECT_NE(v.error().message().find("exceeds the number of lines"), std::string::npos) << v.error().message();
}

TEST(Vocab, LoadReportsMissingFile) {
  auto v = Vocab::load("/nonexistent/tiktoken.model");
  ASSERT_FALSE(v);
}

TEST(Vocab, ByteLevelFormatMapsBackToRawBytes) {
  // GPT-2 bytes_to_unicode: ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ'; '<｜x｜>' is not byte-level.
  auto v = Vocab::parse(b64("\xC4\xA0") + " 0\n" + b64("\xC4\x8A") + " 1\n" + b64("\xC4\xA0the") + " 2\n" +
                            b64("<\xEF\xBD\x9Cx\xEF\xBD\x9C>") + " 3\n",
                        "t", VocabFormat::kGpt2ByteLevel);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v->bytes(0), " ");
  EXPECT_EQ(v->bytes(1), "\n");
  EXPECT_EQ(v->rank(" the"), 2);
  EXPECT_FALSE(v->mergeable(3));
  EXPECT_EQ(v->bytes(3), "<\xEF\xBD\x9Cx\xEF\xBD\x9C>");
  EXPECT_EQ(v->rank(v->bytes(3)), -1);
}

}  // namespace
}  // namespace kestrel::chat
