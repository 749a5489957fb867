#define PCRE2_CODE_UNIT_WIDTH 8
#include "chat/pretokenizer.h"

#include <pcre2.h>

#include "base/check.h"

namespace kestrel::chat {

namespace {

// tiktoken 0.14 `tiktoken_ext/openai_public.py`, cl100k_base pat_str (verbatim).
constexpr std::string_view kCl100k =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";

// tiktoken 0.14 `tiktoken_ext/openai_public.py`, o200k_base pat_str (the "|".join of its list, verbatim).
constexpr std::string_view kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama 3: `pat_str` of Meta's llama3 `tokenizer.py`, identical to the Split regex of its tokenizer.json;
// recorded verbatim as LLAMA3_PATTERN in ml-rust/splintr `src/core/tokenizer/patterns.rs` (MIT).
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek-V3: the three `Split` pre-tokenizers of DeepSeek's tokenizer.json, applied in sequence; recorded as
// DEEPSEEK_V3_PATTERNS in ml-rust/splintr `src/core/tokenizer/patterns.rs` and as
// LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM in llama.cpp `llama-vocab.cpp`. Pass 2 is written with the literal
// characters U+4E00-U+9FA5, U+3040-U+309F, U+30A0-U+30FF as in tokenizer.json.
constexpr std::string_view kDeepSeekPass1 = R"(\p{N}{1,3})";
constexpr std::string_view kDeepSeekPass2 = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr std::string_view kDeepSeekPass3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Kimi K2/K3 `tokenization_kimi.py` pat_str (docs/model-math.md §4.2), verbatim (fancy-regex syntax with `&&`).
constexpr std::string_view kKimi =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// PCRE2 10.42 has no class intersection. Every code point has exactly one general category, so
//   [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M} && [^\p{Han}]] == [^\p{Ll}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]
//   [\p{Ll}\p{Lm}\p{Lo}\p{M}       && [^\p{Han}]] == [^\p{Lu}\p{Lt}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]
// (complement of the union = union of the other categories, plus Han). Han is written \p{sc:Han}: tiktoken's
// regex engine reads a bare \p{Han} as Script=Han, PCRE2 >= 10.40 as Script_Extensions (which would also take
// CJK punctuation such as U+3002; caught by the parity test). A negated single class also keeps the JIT on its
// fast single-class repeat path.
constexpr std::string_view kKimiPcre2 =
    R"([\p{sc:Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[^\p{Ll}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]*[^\p{Lu}\p{Lt}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[^\p{Ll}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]+[^\p{Lu}\p{Lt}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Unicode White_Space (what `\s` means in Rust regex / fancy-regex and Oniguruma).
constexpr std::string_view kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    KCHECK(data && context && stack, "pcre2: out of memory");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

struct PreTokenizer::Pass {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Pass() { pcre2_code_free(code); }
};

std::optional<Pattern> pattern_from_name(std::string_view name) {
  for (Pattern p : {Pattern::kKimi, Pattern::kCl100k, Pattern::kO200k, Pattern::kLlama3, Pattern::kDeepSeekV3}) {
    if (pattern_name(p) == name) return p;
  }
  return std::nullopt;
}

std::string_view pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kKimi: return "kimi";
    case Pattern::kCl100k: return "cl100k";
    case Pattern::kO200k: return "o200k";
    case Pattern::kLlama3: return "llama3";
    case Pattern::kDeepSeekV3: return "deepseek_v3";
  }
  return "?";
}

std::vector<std::string> upstream_pattern(Pattern p) {
  switch (p) {
    case Pattern::kKimi: return {std::string(kKimi)};
    case Pattern::kCl100k: return {std::string(kCl100k)};
    case Pattern::kO200k: return {std::string(kO200k)};
    case Pattern::kLlama3: return {std::string(kLlama3)};
    case Pattern::kDeepSeekV3:
      return {std::string(kDeepSeekPass1), std::string(kDeepSeekPass2), std::string(kDeepSeekPass3)};
  }
  return {};
}

Result<std::string> translate_for_pcre2(std::string_view in) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '\\') {
      if (i + 1 >= in.size()) return invalid_argument("pattern ends with a backslash");
      const char d = in[++i];
      if (d == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (d == 'S') {
        if (in_class) return unsupported("\\S inside a character class");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (c == '[') {
      if (in_class) return unsupported("nested character class (class set operations) at offset " +
                                       std::to_string(i));
      in_class = true;
      out += c;
      if (i + 1 < in.size() && in[i + 1] == '^') out += in[++i];
      if (i + 1 < in.size() && in[i + 1] == ']') out += in[++i];  // leading ']' is a literal
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  if (in_class) return invalid_argument("unterminated character class");
  return out;
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

Result<PreTokenizer> PreTokenizer::create(Pattern p) {
  std::vector<std::string> passes;
  std::vector<std::string> sources = p == Pattern::kKimi ? std::vector<std::string>{std::string(kKimiPcre2)}
                                                         : upstream_pattern(p);
  for (const std::string& s : sources) {
    auto t = translate_for_pcre2(s);
    if (!t) return t.error();
    passes.push_back(std::move(*t));
  }
  return create_from_pcre2(passes);
}

Result<PreTokenizer> PreTokenizer::create_from_pcre2(const std::vector<std::string>& passes) {
  if (passes.empty()) return invalid_argument("pre-tokenizer needs at least one pattern");
  PreTokenizer pt;
  for (const std::string& src : passes) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto pass = std::make_unique<Pass>();
    pass->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(src.data()), src.size(),
                               PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (pass->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return invalid_argument("pcre2 compile error at offset " + std::to_string(err_off) + ": " +
                              reinterpret_cast<const char*>(msg) + " in pattern: " + src);
    }
    pass->jit = pcre2_jit_compile(pass->code, PCRE2_JIT_COMPLETE) == 0;
    pt.passes_.push_back(std::move(pass));
  }
  return pt;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (!text.empty()) split_pass(0, text, out);
}

void PreTokenizer::split_pass(size_t pass, std::string_view text, std::vector<std::string_view>& out) const {
  const Pass& p = *passes_[pass];
  MatchState& st = match_state();
  const bool last = pass + 1 == passes_.size();
  auto emit = [&](size_t a, size_t b) {
    if (a == b) return;
    if (last) {
      out.push_back(text.substr(a, b - a));
    } else {
      split_pass(pass + 1, text.substr(a, b - a), out);
    }
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = p.jit ? pcre2_jit_match(p.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.data,
                                           st.context)
                         : pcre2_match(p.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.data,
                                       st.context);
    if (rc < 0) {
      // PCRE2_ERROR_NOMATCH, or a resource limit: keep the rest as one piece (never drop bytes).
      emit(pos, text.size());
      return;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t ms = ov[0], me = ov[1];
    if (me == ms) {  // empty match (not produced by built-in patterns): take one code point
      me = ms + 1;
      while (me < text.size() && (static_cast<uint8_t>(text[me]) & 0xC0) == 0x80) ++me;
    }
    emit(pos, ms);
    emit(ms, me);
    pos = me;
  }
}

}  // namespace kestrel::chat
