// ChatFormat: the seam between the HTTP layer and a model's chat template / output grammar.
//
// The server parses OpenAI requests into the plain types below and asks a ChatFormat to turn them into prompt
// token ids; generated text goes back through an OutputParser that splits it into the OpenAI fields
// (reasoning_content, content, tool_calls). The K3 (XTML) implementation lives in chat/ and is wired in by the
// app; tests use a trivial one. Implementations must be immutable after construction: render() and
// make_output_parser() are called concurrently from HTTP I/O threads. An OutputParser is used by one stream
// only (not thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace kestrel::server {

// One element of a message's content array. Only text and image_url parts exist (validated by the schema).
struct ContentPart {
  enum class Kind { kText, kImageUrl };
  Kind kind = Kind::kText;
  std::string text;    // kText
  std::string url;     // kImageUrl: a data: or http(s) URL, not fetched by the server
  std::string detail;  // kImageUrl: "auto" | "low" | "high" | "" (absent)
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as sent / generated (not re-validated)
};

struct ChatMessage {
  std::string role;  // system | developer | user | assistant | tool
  // Either plain text (content_parts empty) or a list of parts; has_content is false for a null/absent content.
  bool has_content = false;
  std::string content;
  std::vector<ContentPart> content_parts;
  std::string name;               // optional participant name
  std::string reasoning_content;  // assistant: previous reasoning (multi-turn)
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool
};

struct ToolDef {
  std::string name;
  std::string description;
  nlohmann::json parameters = nlohmann::json::object();  // JSON Schema object
  bool strict = false;
};

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

struct ReasoningOptions {
  bool thinking = true;  // chat_template_kwargs.thinking / top-level `thinking`
  std::string effort;    // reasoning_effort: "" (default) | none | minimal | low | medium | high
};

struct RenderInput {
  const std::vector<ChatMessage>* messages = nullptr;
  const std::vector<ToolDef>* tools = nullptr;  // may be empty
  ToolChoice tool_choice;
  ReasoningOptions reasoning;
  bool add_generation_prompt = true;
  // The request's images, in order: each image part (or placeholder in the text) is rendered as the next of these
  // expanded placeholders. Null: image parts are rendered without pixels (the format's plain placeholder).
  const std::vector<std::string>* image_prompts = nullptr;
};

struct ToolCallDelta {
  int index = 0;          // position of the call in this choice (0, 1, ...)
  std::string id;         // set on the first delta of a call
  std::string name;       // set on the first delta of a call
  std::string arguments;  // appended text
};

// What a chunk of generated text contributed to the OpenAI fields. Text fields are valid UTF-8.
struct ParsedDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool done = false;  // the parser saw the end of the assistant message (no further text matters)
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Feeds decoded UTF-8 text (any split); returns what can be emitted now (may hold back partial markers).
  virtual ParsedDelta push(std::string_view text) = 0;
  // End of generation: returns anything held back. No push() after finish().
  virtual ParsedDelta finish() = 0;
};

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  // Messages (+ tools) → prompt token ids. Errors (e.g. unsupported image, bad tool-call history) are
  // returned as kInvalidArgument / kUnsupported and become HTTP 400.
  virtual Result<std::vector<int32_t>> render(const RenderInput& input) const = 0;
  virtual std::unique_ptr<OutputParser> make_output_parser(const ReasoningOptions& reasoning) const = 0;
  // Tokens that end an assistant turn (added to GenerationParams::stop_token_ids unless ignore_eos).
  virtual std::vector<int32_t> stop_token_ids() const = 0;
};

}  // namespace kestrel::server
