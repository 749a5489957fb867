// PreTokenizer: splits text into pieces with PCRE2 (UTF + UCP, JIT) before BPE.
// Pieces tile the input exactly: text between matches is kept as its own piece (HF "Isolated" split), which is
// identical to tiktoken for every built-in pattern since each of them matches every character.
// A pattern is one or more passes; each pass re-splits every piece of the previous one (DeepSeek-V3 uses three).
// Thread-safe: split() is const and uses per-thread match state.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace kestrel::chat {

enum class Pattern { kKimi, kCl100k, kO200k, kLlama3, kDeepSeekV3 };

std::optional<Pattern> pattern_from_name(std::string_view name);  // "kimi", "cl100k", "o200k", ...
std::string_view pattern_name(Pattern p);

// The upstream pattern strings (fancy-regex / Oniguruma syntax), verbatim, one per pass.
std::vector<std::string> upstream_pattern(Pattern p);

// Rewrites upstream syntax for PCRE2: `\s`/`\S` become the Unicode White_Space class that Rust's regex and
// Oniguruma use (PCRE2's own `\s` also matches U+180E). Nested class intersection (`&&`) is not handled here;
// the Kimi pattern is hand-translated (see pretokenizer.cpp).
Result<std::string> translate_for_pcre2(std::string_view upstream);

class PreTokenizer {
 public:
  static Result<PreTokenizer> create(Pattern p);
  // Passes in PCRE2 syntax (already translated). Used by tests and custom vocabularies.
  static Result<PreTokenizer> create_from_pcre2(const std::vector<std::string>& passes);

  PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends the pieces of `text` (valid UTF-8) to `out`; views point into `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Pass;
  void split_pass(size_t pass, std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<std::unique_ptr<Pass>> passes_;
};

}  // namespace kestrel::chat
