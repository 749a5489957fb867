#include "app/k3_chat_format.h"

#include "chat/k3_renderer.h"
#include "chat/output_parser.h"

namespace kestrel::app {

namespace {

class K3Parser final : public server::OutputParser {
 public:
  explicit K3Parser(bool thinking) : p_(chat::OutputParserOptions{chat::OutputFormat::kKimiK3, thinking}) {}
  server::ParsedDelta push(std::string_view text) override { return convert(p_.push(text)); }
  server::ParsedDelta finish() override { return convert(p_.finish()); }

 private:
  static server::ParsedDelta convert(const chat::ParseDelta& d) {
    server::ParsedDelta o;
    o.reasoning_content = d.reasoning_content;
    o.content = d.content;
    for (const auto& c : d.tool_calls) o.tool_calls.push_back({c.index, c.id, c.name, c.arguments});
    o.done = d.finished;
    return o;
  }
  chat::OutputParser p_;
};

// OpenAI `reasoning_effort` → K3's thinking switch and effort. K3 accepts low / high / max; OpenAI
// clients commonly send "medium" (the reference rejects it although its own preamble names it), so
// it maps to "high"; "minimal" maps to "low"; "none" turns thinking off.
Status apply_reasoning(const server::ReasoningOptions& r, chat::ChatRequest& req) {
  req.thinking = r.thinking;
  std::string e = r.effort;
  if (e.empty()) return Status::ok();
  if (e == "none") return req.thinking = false, Status::ok();
  if (e == "minimal") e = "low";
  if (e == "medium") e = "high";
  auto parsed = chat::parse_thinking_effort(e);
  if (!parsed) return invalid_argument("reasoning_effort: " + parsed.error().message());
  req.thinking_effort = *parsed;
  return Status::ok();
}

}  // namespace

K3ChatFormat::K3ChatFormat(const chat::Tokenizer& tok) : tok_(tok) {
  if (auto id = tok.special_id("<|end_of_msg|>")) stops_.push_back(*id);
}

Result<std::vector<int32_t>> K3ChatFormat::render(const server::RenderInput& in) const {
  chat::ChatRequest req;
  KESTREL_RETURN_IF_ERROR(apply_reasoning(in.reasoning, req));
  req.add_generation_prompt = in.add_generation_prompt;
  if (in.image_prompts != nullptr) req.image_prompts = *in.image_prompts;
  switch (in.tool_choice.mode) {
    case server::ToolChoice::Mode::kNone: req.tool_choice = chat::ToolChoice::kNone; break;
    case server::ToolChoice::Mode::kRequired:
    case server::ToolChoice::Mode::kNamed: req.tool_choice = chat::ToolChoice::kRequired; break;
    case server::ToolChoice::Mode::kAuto: req.tool_choice = chat::ToolChoice::kAuto; break;
  }
  if (in.tools)
    for (const auto& t : *in.tools) {
      nlohmann::json fn = {{"name", t.name}, {"parameters", t.parameters}};
      if (!t.description.empty()) fn["description"] = t.description;
      req.tools.push_back(nlohmann::json{{"type", "function"}, {"function", fn}}.dump());
    }
  for (const auto& m : *in.messages) {
    chat::Message cm;
    // OpenAI's "developer" role is the newer name of "system".
    auto role = chat::role_from_name(m.role == "developer" ? "system" : m.role);
    if (!role) return invalid_argument("messages: unsupported role '" + m.role + "'");
    cm.role = *role;
    if (!m.content_parts.empty()) {
      cm.has_parts = true;
      for (const auto& p : m.content_parts) {
        chat::ContentPart cp;
        cp.kind = p.kind == server::ContentPart::Kind::kText ? chat::ContentPart::Kind::kText : chat::ContentPart::Kind::kImage;
        cp.text = p.text;
        cm.parts.push_back(std::move(cp));
      }
    } else if (m.has_content) {
      cm.content = m.content;
    }
    if (!m.name.empty()) cm.name = m.name;
    if (!m.reasoning_content.empty()) cm.reasoning_content = m.reasoning_content;
    for (const auto& c : m.tool_calls) cm.tool_calls.push_back({c.id, c.name, c.arguments});
    if (!m.tool_call_id.empty()) cm.tool_call_id = m.tool_call_id;
    req.messages.push_back(std::move(cm));
  }
  auto segs = chat::render_k3_segments(req);
  if (!segs) return segs.error();
  return chat::encode_segments(tok_, *segs);
}

std::unique_ptr<server::OutputParser> K3ChatFormat::make_output_parser(const server::ReasoningOptions& r) const {
  bool thinking = r.thinking && r.effort != "none";
  return std::make_unique<K3Parser>(thinking);
}

}  // namespace kestrel::app
