// OpenAI-style chat request types shared by the renderers (k3_renderer, k2_renderer) and the output parser.
// Plain data; the server layer fills them from a request body.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kestrel::chat {

enum class Role { kSystem, kUser, kAssistant, kTool };

// A role name from a request ("system", "user", "assistant", "tool"); anything else (e.g. OpenAI "developer") is
// nullopt. The renderers refuse such messages; the K3 reference silently drops them instead.
std::optional<Role> role_from_name(std::string_view name);

struct ContentPart {
  enum class Kind { kText, kImage };  // kImage: an "image" / "image_url" part; its pixels travel elsewhere
  Kind kind = Kind::kText;
  std::string text;  // kText only
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the OpenAI JSON-object string, as the client sent it
};

struct Message {
  Role role = Role::kUser;
  // Content: a string, a list of parts, or null (both unset / has_parts false and content nullopt).
  std::optional<std::string> content;
  std::vector<ContentPart> parts;
  bool has_parts = false;  // true: `parts` is the content (and `content` is ignored)
  std::optional<std::string> name;               // participant name; for tool messages the tool's name
  std::optional<std::string> reasoning_content;  // assistant history: the think channel to replay
  std::vector<ToolCall> tool_calls;              // assistant
  std::optional<std::string> tool_call_id;       // tool results
  std::vector<std::string> tools;                // system message carrying tool specs (K3 dynamic declare); JSON each
};

enum class ThinkingEffort { kLow, kHigh, kMax };
enum class ToolChoice { kAuto, kRequired, kNone };

struct ResponseFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema };
  Kind kind = Kind::kText;
  std::string schema_json;  // kJsonSchema: the JSON Schema object
};

struct ChatRequest {
  std::vector<Message> messages;
  std::vector<std::string> tools;  // OpenAI tool declarations, one JSON object text each ({"type":"function",...})
  bool thinking = true;
  // Kimi's apply_chat_template passes thinking_effort="max" unless told otherwise; nullopt renders no preamble.
  std::optional<ThinkingEffort> thinking_effort = ThinkingEffort::kMax;
  bool add_generation_prompt = true;
  ToolChoice tool_choice = ToolChoice::kAuto;
  ResponseFormat response_format;
  // Media blocks that replace image parts / placeholders, in order (vision path). nullopt: leave the placeholder
  // text `<|kimi_image_placeholder|>` in place (as the reference does).
  std::optional<std::vector<std::string>> image_prompts;
};

// One run of prompt text and how to tokenize it: allow_special = structural markers (special-token strings become
// their ids); otherwise the text is ordinary text even if it spells a special token.
struct Segment {
  std::string text;
  bool allow_special = false;
  bool operator==(const Segment&) const = default;
};

}  // namespace kestrel::chat
