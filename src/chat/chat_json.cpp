#include "chat/chat_json.h"

#include <string>

namespace kestrel::chat {

namespace {

const std::string* string_member(const Json& obj, std::string_view key) {
  const Json* v = obj.find(key);
  return v && v->is_string() ? &v->as_string() : nullptr;
}

Status parse_content(const Json& m, Message& out, const std::string& where) {
  const Json* c = m.find("content");
  if (!c || c->is_null()) return Status::ok();
  if (c->is_string()) {
    out.content = c->as_string();
    return Status::ok();
  }
  if (!c->is_array()) return invalid_argument(where + ": content must be a string, an array of parts or null");
  out.has_parts = true;
  for (size_t i = 0; i < c->items().size(); ++i) {
    const Json& p = c->items()[i];
    const std::string* type = p.is_object() ? string_member(p, "type") : nullptr;
    if (!type) return invalid_argument(where + ": content part " + std::to_string(i) + " has no type");
    if (*type == "image" || *type == "image_url") {
      out.parts.push_back({ContentPart::Kind::kImage, {}});
    } else {
      const std::string* text = string_member(p, "text");
      if (!text) return invalid_argument(where + ": content part " + std::to_string(i) + " has no text");
      out.parts.push_back({ContentPart::Kind::kText, *text});
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<std::string>> tools_from_json(const Json& tools) {
  std::vector<std::string> out;
  if (tools.is_null()) return out;
  if (!tools.is_array()) return invalid_argument("tools must be an array");
  for (const auto& t : tools.items()) out.push_back(t.dump());
  return out;
}

Result<std::vector<Message>> messages_from_json(const Json& messages) {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  std::vector<Message> out;
  for (size_t i = 0; i < messages.items().size(); ++i) {
    const Json& m = messages.items()[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_argument(where + " is not an object");
    const std::string* role_name = string_member(m, "role");
    if (!role_name) return invalid_argument(where + " has no role");
    auto role = role_from_name(*role_name);
    if (!role)
      return invalid_argument(where + ": unsupported role \"" + *role_name +
                              "\" (supported: system, user, assistant, tool)");
    Message msg;
    msg.role = *role;
    KESTREL_RETURN_IF_ERROR(parse_content(m, msg, where));
    if (const std::string* s = string_member(m, msg.role == Role::kTool && m.find("tool") ? "tool" : "name"))
      msg.name = *s;
    if (const std::string* s = string_member(m, "reasoning_content"); s && !s->empty()) {
      msg.reasoning_content = *s;
    } else if (const std::string* r = string_member(m, "reasoning")) {
      msg.reasoning_content = *r;
    } else if (s) {
      msg.reasoning_content = *s;
    }
    if (const std::string* s = string_member(m, "tool_call_id")) msg.tool_call_id = *s;
    if (const Json* calls = m.find("tool_calls"); calls && calls->is_array()) {
      for (const auto& c : calls->items()) {
        const Json* fn = c.find("function");
        if (!fn || !fn->is_object()) fn = &c;
        const std::string* name = string_member(*fn, "name");
        if (!name) return invalid_argument(where + ": tool call without a function name");
        ToolCall call;
        if (const std::string* id = string_member(c, "id")) call.id = *id;
        call.name = *name;
        if (const Json* a = fn->find("arguments"); a && !a->is_null())
          call.arguments = a->is_string() ? a->as_string() : a->dump();
        msg.tool_calls.push_back(std::move(call));
      }
    }
    if (const Json* t = m.find("tools"); t && t->is_array() && msg.role == Role::kSystem) {
      auto tools = tools_from_json(*t);
      if (!tools) return tools.error();
      msg.tools = std::move(*tools);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace kestrel::chat
