// Streaming parser of model output into OpenAI chat fields (reasoning_content, content, tool_calls).
//
// Fed decoded text in chunks of any size (StreamDecoder output, or raw bytes split anywhere), it returns deltas.
// Text that might be the start of a marker is held back until the next chunk decides it; a tool call is emitted
// whole once its closing marker arrives (OpenAI clients accept a call in one delta). Input the grammar does not
// expect never fails: it is emitted as plain content (a malformed or truncated call included, verbatim).
//
// K3 (XTML, docs/model-math.md §4.6; the generation prompt opened `<|open|>think<|sep|>`, or
// `<|open|>response<|sep|>` with thinking off): REASONING <|close|>think<|sep|> <|open|>response<|sep|> CONTENT
// <|close|>response<|sep|>
//   [<|open|>tools<|sep|> (<|open|>call tool="N" index="i"<|sep|> (<|open|>argument key="K" type="T"<|sep|>V
//   <|close|>argument<|sep|>)* <|close|>call<|sep|>)* <|close|>tools<|sep|>] <|close|>message<|sep|> <|end_of_msg|>
//   Arguments are assembled into a JSON object `{"K": V, ...}`: type="string" values are JSON-quoted, other
//   types are kept verbatim when they parse as JSON (else quoted as a string). A `<|open|>json type="object"<|sep|>RAW
//   <|close|>json<|sep|>` body is passed through as the arguments. K3 output carries no call ids: they are
//   `id_prefix` + the call's 0-based position in the stream.
// K2 (Kimi K2 / Kimi Linear): [<think>REASONING</think>] CONTENT [<|tool_calls_section_begin|>
//   (<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>)*
//   <|tool_calls_section_end|>] <|im_end|>; the id is `functions.NAME:IDX` as written.
// The stop marker (<|end_of_msg|> / <|im_end|>) sets `finished`; anything after it is ignored.
// Not thread-safe: one parser per stream.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kestrel::chat {

enum class OutputFormat { kKimiK3, kKimiK2 };

struct OutputParserOptions {
  OutputFormat format = OutputFormat::kKimiK3;
  // K3: the generation prompt opened the think channel (thinking on). False: it opened the response channel.
  // K2: ignored (a leading <think> is detected).
  bool starts_in_reasoning = true;
  std::string id_prefix = "call_";  // K3 tool call ids
};

struct ToolCallDelta {
  int index = 0;  // 0-based position of the call in this stream
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object text (or the raw body the model wrote)
  bool operator==(const ToolCallDelta&) const = default;
};

struct ParseDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool finished = false;  // the stop marker arrived (in this delta)
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty() && !finished; }
  void append(const ParseDelta& d);  // accumulate (tests, non-streaming callers)
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});

  ParseDelta push(std::string_view text);
  // End of stream (stop token or length limit): releases held-back text; an unfinished call becomes content.
  ParseDelta finish();
  bool finished() const { return state_ == State::kDone; }

 private:
  enum class State { kK2Start, kReasoning, kContent, kBetween, kTools, kAfterMessage, kDone };
  struct Term {
    std::string_view marker;
    State next;
  };

  void run(ParseDelta& out, bool at_end);
  bool step(ParseDelta& out, bool at_end);  // false: needs more input
  bool text_state(ParseDelta& out, bool at_end, const std::vector<Term>& terms);
  bool expect_state(ParseDelta& out, bool at_end, const std::vector<Term>& terms);
  bool k3_tools(ParseDelta& out, bool at_end);
  bool k2_tools(ParseDelta& out, bool at_end);
  void emit(ParseDelta& out, std::string_view text);
  void emit_call(ParseDelta& out, std::string name, std::string id, std::string arguments);
  void enter(State s, ParseDelta& out);

  OutputParserOptions opt_;
  State state_;
  State text_channel_ = State::kContent;  // where plain text goes in kReasoning/kContent
  std::string buf_;
  int calls_ = 0;
};

}  // namespace kestrel::chat
