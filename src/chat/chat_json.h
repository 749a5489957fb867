// OpenAI chat-completions JSON -> ChatRequest pieces (messages, tools, thinking options).
// Unknown roles are an error naming the message (the K3 reference renderer would silently drop them).
#pragma once

#include <vector>

#include "base/result.h"
#include "chat/chat_types.h"
#include "chat/json.h"

namespace kestrel::chat {

// `messages` array. Accepts content as string / null / parts ({"type":"text","text"} or image / image_url parts),
// reasoning_content (or "reasoning"), tool_calls [{id, function: {name, arguments}}] with string or object arguments,
// tool_call_id, name (or "tool" for tool results), and "tools" on system messages.
Result<std::vector<Message>> messages_from_json(const Json& messages);
// `tools` array: each element re-serialized as its own JSON text.
Result<std::vector<std::string>> tools_from_json(const Json& tools);

}  // namespace kestrel::chat
