#include "chat/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "chat/utf8.h"
#include "test_util.h"

namespace kestrel::chat {
namespace {

Tokenizer toy(const std::vector<std::string>& merges, Pattern p = Pattern::kCl100k,
              std::vector<SpecialToken> specials = {}, std::optional<ChunkCaps> caps = std::nullopt) {
  auto v = Vocab::parse(test::toy_vocab_text(merges), "toy");
  KCHECK(v.has_value(), "toy vocab");
  auto pre = PreTokenizer::create(p);
  KCHECK(pre.has_value(), "pattern");
  auto t = Tokenizer::create(std::move(*v), std::move(*pre), std::move(specials), caps);
  KCHECK(t.has_value(), "tokenizer");
  return std::move(*t);
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

TEST(Bpe, MergesLowestRankFirstLeftmostOnTies) {
  // ranks: "ab"=256, "bc"=257, "abc"=258.
  Tokenizer t = toy({"ab", "bc", "abc"});
  EXPECT_EQ(t.encode("abc", SpecialMode::kAsText), ids({258}));   // whole piece is a token
  EXPECT_EQ(t.encode("abcb", SpecialMode::kAsText), ids({258, 'b'}));
  // "bcab": bc(257) vs ab(256) -> ab first, then "bc","ab" remain.
  EXPECT_EQ(t.encode("bcab", SpecialMode::kAsText), ids({257, 256}));
  Tokenizer u = toy({"aa"});
  EXPECT_EQ(u.encode("aaa", SpecialMode::kAsText), ids({256, 'a'}));  // leftmost pair wins the tie
}

TEST(Bpe, LongPiecesMatchShortAlgorithm) {
  // 'a' * n with "aa", "aaaa": both code paths (n <= 128 rescan, n > 128 heap) must agree with the rule.
  Tokenizer t = toy({"aa", "aaaa"});
  for (size_t n : {1u, 2u, 3u, 5u, 127u, 128u, 129u, 130u, 1001u, 5003u}) {
    const auto got = t.encode(std::string(n, 'a'), SpecialMode::kAsText);
    std::vector<int32_t> want(n / 4, 257);
    if (n % 4 >= 2) want.push_back(256);
    if (n % 2) want.push_back('a');
    EXPECT_EQ(got, want) << n;
  }
}

TEST(Tokenizer, RejectsVocabularyWithoutAllBytes) {
  auto v = Vocab::parse(test::b64("a") + " 0\n", "v");
  ASSERT_TRUE(v);
  auto t = Tokenizer::create(std::move(*v), PreTokenizer::create(Pattern::kCl100k).value(), {}, std::nullopt);
  ASSERT_FALSE(t);
  EXPECT_NE(t.error().message().find("byte 0"), std::string::npos);
}

TEST(Tokenizer, RejectsBadSpecials) {
  auto make = [](std::vector<SpecialToken> s) {
    auto v = Vocab::parse(test::toy_vocab_text({}), "v");
    return Tokenizer::create(std::move(*v), PreTokenizer::create(Pattern::kCl100k).value(), std::move(s),
                             std::nullopt);
  };
  EXPECT_FALSE(make({{"<x>", 5}}));                    // collides with a rank
  EXPECT_FALSE(make({{"<x>", 300}, {"<y>", 300}}));    // same id twice
  EXPECT_FALSE(make({{"<x>", 300}, {"<x>", 301}}));    // same text twice
  EXPECT_FALSE(make({{"", 300}}));
  EXPECT_TRUE(make({{"<x>", 300}, {"<y>", 400}}));
}

TEST(Tokenizer, SpecialModes) {
  Tokenizer t = toy({}, Pattern::kCl100k, {{"<|open|>", 300}, {"<|open|>x", 301}, {"<|sep|>", 302}});
  EXPECT_EQ(t.encode("<|open|>", SpecialMode::kAllow), ids({300}));
  EXPECT_EQ(t.encode("<|open|>x<|sep|>", SpecialMode::kAllow), ids({301, 302}));  // leftmost-longest
  const auto as_text = t.encode("<|open|>", SpecialMode::kAsText);
  EXPECT_GT(as_text.size(), 1u);
  for (int32_t id : as_text) EXPECT_FALSE(t.is_special(id));
  EXPECT_EQ(*t.decode(as_text), "<|open|>");
  EXPECT_EQ(t.special_id("<|sep|>"), 302);
  EXPECT_EQ(t.vocab_size(), 303);
  EXPECT_FALSE(t.token_bytes(303));
  EXPECT_EQ(*t.token_bytes(302), "<|sep|>");
  // Segment-by-segment rendering: structural markers allowed, content as text.
  std::vector<int32_t> out;
  t.encode_append("<|open|>", SpecialMode::kAllow, out);
  t.encode_append("user says <|sep|>", SpecialMode::kAsText, out);
  t.encode_append("<|sep|>", SpecialMode::kAllow, out);
  EXPECT_EQ(out.front(), 300);
  EXPECT_EQ(out.back(), 302);
  EXPECT_EQ(std::count(out.begin(), out.end(), 302), 1);
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  Tokenizer t = toy({});
  auto r = t.decode(ids({'a', 999}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("999 at index 1"), std::string::npos);
  EXPECT_FALSE(t.decode(ids({-1})));
}

TEST(Tokenizer, KimiCapsCutRuns) {
  // With caps {chunk 10, run 3}: "aaaaaaa" (7 non-space) -> "aaa","aaa","a" encoded separately.
  Tokenizer t = toy({"aa", "aaaa"}, Pattern::kKimi, {}, ChunkCaps{10, 3});
  EXPECT_EQ(t.encode("aaaaaaa", SpecialMode::kAsText), ids({256, 'a', 256, 'a', 'a'}));
  // Outer chunk of 10 code points: "ab ab ab ab" -> "ab ab ab a" + "b".
  Tokenizer u = toy({"ab", " ab"}, Pattern::kKimi, {}, ChunkCaps{10, 100});
  EXPECT_EQ(u.encode("ab ab ab ab", SpecialMode::kAsText), ids({256, 257, 257, ' ', 'a', 'b'}));
  // Python str.isspace() counts U+001C as space: 4 of them are a run of 4 > 3.
  Tokenizer w = toy({}, Pattern::kKimi, {}, ChunkCaps{100, 3});
  EXPECT_EQ(w.encode("\x1c\x1c\x1c\x1c", SpecialMode::kAsText), ids({0x1c, 0x1c, 0x1c, 0x1c}));
}

TEST(Tokenizer, InvalidUtf8) {
  Tokenizer t = toy({});
  // encode(): maximal invalid subparts become U+FFFD (Python decode(errors="replace")).
  EXPECT_EQ(t.encode("a\xff" "b\xe2\x82", SpecialMode::kAsText),
            t.encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD", SpecialMode::kAsText));
  // encode_bytes(): exact round trip for arbitrary bytes.
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : 'a' + rng() % 3);
    EXPECT_EQ(*t.decode(t.encode_bytes(s, SpecialMode::kAllow)), s);
  }
}

// ---- Real vocabularies (tools/extract_vocabs.py) against committed tiktoken goldens -----------------------

struct Real {
  std::map<std::string, Tokenizer> by_name;
  static Real& get() {
    static Real r;
    return r;
  }
  Real() {
    auto add = [&](const std::string& name, TokenizerConfig c) {
      auto t = Tokenizer::create(c);
      if (!t) {
        ADD_FAILURE() << name << ": " << t.error().message()
                      << " (tools/extract_vocabs.py writes the vocabularies)";
        return;
      }
      by_name.emplace(name, std::move(*t));
    };
    add("cl100k", cl100k_config(test::vocab_path("cl100k_base")));
    add("o200k", o200k_config(test::vocab_path("o200k_base")));
    add("llama3", llama3_config(test::vocab_path("llama3")));
    add("deepseek_v3", deepseek_v3_config(test::vocab_path("deepseek_v3")));
    TokenizerConfig k = o200k_config(test::vocab_path("o200k_base"));  // K3 pattern + caps + specials on o200k
    k.pattern = Pattern::kKimi;
    k.caps = ChunkCaps{};
    k.specials = kimi_k3_specials(199998);
    add("k3_on_o200k", k);
  }
};

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

TEST(TokenizerGolden, MatchesTiktoken) {
  std::ifstream f(std::string(KESTREL_CHAT_TEST_DATA) + "/tiktoken_goldens.tsv");
  ASSERT_TRUE(f) << "missing tiktoken_goldens.tsv";
  std::string line;
  int checked = 0;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string name, hex, id_text;
    std::getline(ss, name, '\t');
    std::getline(ss, hex, '\t');
    std::getline(ss, id_text);
    std::vector<int32_t> want;
    std::istringstream is(id_text);
    for (int32_t id; is >> id;) want.push_back(id);
    auto it = Real::get().by_name.find(name);
    ASSERT_NE(it, Real::get().by_name.end()) << name;
    const std::string text = unhex(hex);
    const SpecialMode mode = name == "deepseek_v3" ? SpecialMode::kAsText : SpecialMode::kAllow;
    EXPECT_EQ(it->second.encode(text, mode), want) << name << ": " << text;
    EXPECT_EQ(*it->second.decode(want), text) << name;
    ++checked;
  }
  EXPECT_GE(checked, 80);
}

TEST(TokenizerGolden, RoundTripRandomUnicode) {
  std::mt19937 rng(7);
  for (auto& [name, t] : Real::get().by_name) {
    for (int i = 0; i < 50; ++i) {
      std::string s;
      for (int k = rng() % 200; k > 0; --k) {
        char32_t c = rng() % 4 == 0 ? rng() % 0x110000 : rng() % 0x3000;
        if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
        if (c < 0x80) s += char(c);
        else if (c < 0x800) s += char(0xC0 | c >> 6), s += char(0x80 | (c & 63));
        else if (c < 0x10000) s += char(0xE0 | c >> 12), s += char(0x80 | (c >> 6 & 63)), s += char(0x80 | (c & 63));
        else s += char(0xF0 | c >> 18), s += char(0x80 | (c >> 12 & 63)), s += char(0x80 | (c >> 6 & 63)), s += char(0x80 | (c & 63));
      }
      EXPECT_EQ(*t.decode(t.encode(s, SpecialMode::kAllow)), s) << name;
    }
  }
}

TEST(KimiK3, SpecialTable) {
  const auto s = kimi_k3_specials();
  ASSERT_EQ(s.size(), 256u);
  std::map<int32_t, std::string> m;
  for (auto& t : s) m[t.id] = t.text;
  EXPECT_EQ(m[163584], "[BOS]");
  EXPECT_EQ(m[163586], "<|end_of_msg|>");
  EXPECT_EQ(m[163587], "<|open|>");
  EXPECT_EQ(m[163589], "<|sep|>");
  EXPECT_EQ(m[163594], "<|reserved_token_163594|>");
  EXPECT_EQ(m[163605], "<|media_pad|>");
  EXPECT_EQ(m[163649], "<osagent_mode>");
  EXPECT_EQ(m[163839], "[PAD]");
}

TEST(KimiK3, RealVocabulary) {
  // Kimi K3's released tiktoken.model (tools/extract_vocabs.py checks its SHA-256); KESTREL_KIMI_VOCAB overrides.
  const char* env = std::getenv("KESTREL_KIMI_VOCAB");
  auto t = Tokenizer::create(kimi_k3_config(env ? std::string(env) : test::vocab_path("kimi_k3")));
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->num_ranks(), 163584);
  EXPECT_EQ(t->vocab_size(), 163840);
  EXPECT_EQ(t->encode("<|open|>message<|sep|>", SpecialMode::kAllow).front(), 163587);
}

// An image placeholder of 3,000 pads is one run of 39,000 characters, beyond the reference's 25,000-character run
// cut: every pad stays one id (a cut inside one would spell it as ordinary tokens), and ordinary text in such a
// run is still cut where the reference cuts it.
TEST(KimiK3, LongPadRunsKeepEveryPad) {
  const char* env = std::getenv("KESTREL_KIMI_VOCAB");
  auto t = Tokenizer::create(kimi_k3_config(env ? std::string(env) : test::vocab_path("kimi_k3")));
  ASSERT_TRUE(t) << t.error().message();
  for (size_t lead : {0u, 1u, 5u, 12u}) {
    std::string text = std::string(lead, 'a') + "<|media_content|>";
    for (int i = 0; i < 3000; ++i) text += "<|media_pad|>";
    text += "<|media_end|>";
    const auto ids = t->encode(text, SpecialMode::kAllow);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 163605), 3000) << "lead " << lead;
    EXPECT_EQ(ids.back(), t->encode("<|media_end|>", SpecialMode::kAllow).back());
  }
  // As text (user content), the same characters are cut like any run.
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "<|media_pad|>";
  const auto as_text = t->encode(text, SpecialMode::kAsText);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 163605), 0);
  EXPECT_GT(as_text.size(), 3000u);
}

}  // namespace
}  // namespace kestrel::chat
