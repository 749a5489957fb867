#include "chat/k2_renderer.h"

#include <deque>
#include <string>

#include "chat/json.h"

namespace kestrel::chat {

namespace {

constexpr std::string_view kDefaultSystem = "You are Kimi, an AI assistant created by Moonshot AI.";

class Writer {
 public:
  void control(std::string_view t) { add(t, true); }
  void text(std::string_view t) { add(t, false); }
  void content(const Message& m) {
    if (m.has_parts) {
      for (const auto& p : m.parts) {
        if (p.kind == ContentPart::Kind::kImage) {
          control("<|media_start|>");
          text("image");
          control("<|media_content|>");
          control("<|media_pad|>");
          control("<|media_end|>");
          text("\n");
        } else {
          text(p.text);
        }
      }
    } else if (m.content) {
      text(*m.content);
    }
  }
  bool has_content(const Message& m) const { return m.has_parts || m.content.has_value(); }
  std::vector<Segment> take() { return std::move(out_); }

 private:
  void add(std::string_view t, bool special) {
    if (t.empty()) return;
    if (!out_.empty() && out_.back().allow_special == special && !special) {
      out_.back().text += t;  // adjacent text pieces form one segment (the template renders one string)
    } else {
      out_.push_back(Segment{std::string(t), special});
    }
  }
  std::vector<Segment> out_;
};

std::string_view role_name(Role r) {
  switch (r) {
    case Role::kSystem: return "system";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
  }
  return "system";
}

}  // namespace

Result<std::vector<Segment>> render_k2_segments(const ChatRequest& req) {
  Writer w;
  if (!req.tools.empty()) {
    std::vector<Json> items;
    for (size_t i = 0; i < req.tools.size(); ++i) {
      auto j = Json::parse(req.tools[i]);
      if (!j) return invalid_argument("tool declaration " + std::to_string(i) + ": " + j.error().message());
      items.push_back(std::move(*j));
    }
    w.control("<|im_system|>");
    w.text("tool_declare");
    w.control("<|im_middle|>");
    w.text(Json::array(std::move(items)).dump());
    w.control("<|im_end|>");
  }
  std::deque<std::string> pending_ids;  // ids of calls not yet answered, in call order
  size_t counter = 0;
  for (size_t i = 0; i < req.messages.size(); ++i) {
    const Message& m = req.messages[i];
    if (i == 0 && m.role != Role::kSystem) {
      w.control("<|im_system|>");
      w.text("system");
      w.control("<|im_middle|>");
      w.text(kDefaultSystem);
      w.control("<|im_end|>");
      w.text("\n");  // the template's whitespace, kept for byte parity
    }
    w.control(m.role == Role::kUser ? "<|im_user|>" : m.role == Role::kAssistant ? "<|im_assistant|>" : "<|im_system|>");
    w.text(m.name && !m.name->empty() ? std::string_view(*m.name) : role_name(m.role));
    w.control("<|im_middle|>");
    if (m.role == Role::kAssistant && !m.tool_calls.empty()) {
      w.content(m);
      w.control("<|tool_calls_section_begin|>");
      for (const auto& c : m.tool_calls) {
        std::string id = "functions." + c.name + ":" + std::to_string(counter++);
        w.control("<|tool_call_begin|>");
        w.text(id);
        w.control("<|tool_call_argument_begin|>");
        w.text(c.arguments);
        w.control("<|tool_call_end|>");
        pending_ids.push_back(std::move(id));
      }
      w.control("<|tool_calls_section_end|>");
    } else if (m.role == Role::kTool) {
      std::string id;
      if (!pending_ids.empty()) {
        id = std::move(pending_ids.front());
        pending_ids.pop_front();
      } else {
        id = "functions." + (m.name ? *m.name : std::string("unknown")) + ":" + std::to_string(counter);
      }
      w.text("## Return of " + id + "\n");
      w.content(m);
    } else if (w.has_content(m)) {
      w.content(m);
    }
    w.control("<|im_end|>");
  }
  if (req.add_generation_prompt) {
    w.control("<|im_assistant|>");
    w.text("assistant");
    w.control("<|im_middle|>");
  }
  return w.take();
}

}  // namespace kestrel::chat
