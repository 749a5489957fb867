#include "chat/k3_renderer.h"

#include <algorithm>
#include <utility>

#include "chat/json.h"
#include "chat/text_util.h"

namespace kestrel::chat {

std::optional<Role> role_from_name(std::string_view name) {
  if (name == "system") return Role::kSystem;
  if (name == "user") return Role::kUser;
  if (name == "assistant") return Role::kAssistant;
  if (name == "tool") return Role::kTool;
  return std::nullopt;
}

Result<ThinkingEffort> parse_thinking_effort(std::string_view name) {
  if (name == "low") return ThinkingEffort::kLow;
  if (name == "high") return ThinkingEffort::kHigh;
  if (name == "max") return ThinkingEffort::kMax;
  if (name == "medium")
    return invalid_argument(
        "thinking_effort=medium is not supported by Kimi K3 (its renderer accepts low, high, max, although the "
        "preamble text it renders lists medium too)");
  return invalid_argument("unsupported thinking_effort=" + std::string(name) + " (supported: low, high, max)");
}

std::string join_segments(const std::vector<Segment>& segments) {
  std::string out;
  for (const auto& s : segments) out += s.text;
  return out;
}

std::vector<int32_t> encode_segments(const Tokenizer& tokenizer, const std::vector<Segment>& segments) {
  std::vector<int32_t> ids;
  for (const auto& s : segments)
    tokenizer.encode_append(s.text, s.allow_special ? SpecialMode::kAllow : SpecialMode::kAsText, ids);
  return ids;
}

namespace {

constexpr std::string_view kOpen = "<|open|>";
constexpr std::string_view kClose = "<|close|>";
constexpr std::string_view kSep = "<|sep|>";
constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";
constexpr std::string_view kImagePlaceholder = "<|kimi_image_placeholder|>";

std::string_view effort_name(ThinkingEffort e) {
  switch (e) {
    case ThinkingEffort::kLow: return "low";
    case ThinkingEffort::kHigh: return "high";
    case ThinkingEffort::kMax: return "max";
  }
  return "max";
}

std::string escape_attr(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Builds the segment list; mirrors the reference's helpers one for one (an empty text makes no segment).
class Writer {
 public:
  explicit Writer(const std::optional<std::vector<std::string>>& image_prompts) : image_prompts_(image_prompts) {}

  void control(std::string_view t) { add(t, true); }
  void text(std::string_view t) { add(t, false); }

  void open_tag(std::string_view tag, const std::vector<std::pair<std::string_view, std::string>>& attrs = {}) {
    control(kOpen);
    text(tag);
    for (const auto& [k, v] : attrs) {
      text(std::string(" ") + std::string(k));
      text("=\"");
      text(escape_attr(v));
      text("\"");
    }
    control(kSep);
  }
  void close_tag(std::string_view tag) {
    control(kClose);
    text(tag);
    control(kSep);
  }
  void end_of_msg() { control(kEndOfMsg); }

  void internal_system(std::string_view type, std::string_view body) {
    open_tag("message", {{"role", "system"}, {"type", std::string(type)}});
    text(body);
    close_tag("message");
    end_of_msg();
  }

  // Caller text: with image prompts, each placeholder becomes the next media block (a structural segment).
  Status append_text(std::string_view t) {
    if (t.empty()) return Status::ok();
    if (!image_prompts_ || t.find(kImagePlaceholder) == std::string_view::npos) {
      text(t);
      return Status::ok();
    }
    size_t from = 0;
    while (true) {
      const size_t at = t.find(kImagePlaceholder, from);
      text(t.substr(from, at == std::string_view::npos ? std::string_view::npos : at - from));
      if (at == std::string_view::npos) break;
      KESTREL_RETURN_IF_ERROR(image());
      from = at + kImagePlaceholder.size();
    }
    return Status::ok();
  }

  Status image() {
    if (!image_prompts_) {
      control(kImagePlaceholder);
      return Status::ok();
    }
    if (next_image_ >= image_prompts_->size()) return invalid_argument("more image placeholders than image prompts");
    control((*image_prompts_)[next_image_++]);
    return Status::ok();
  }

  Status content(const Message& m) {
    if (m.has_parts) {
      for (const auto& p : m.parts) {
        KESTREL_RETURN_IF_ERROR(p.kind == ContentPart::Kind::kImage ? image() : append_text(p.text));
      }
    } else if (m.content) {
      KESTREL_RETURN_IF_ERROR(append_text(*m.content));
    }
    return Status::ok();
  }

  Status check_images_consumed() const {
    if (image_prompts_ && next_image_ != image_prompts_->size())
      return invalid_argument("image prompt count " + std::to_string(image_prompts_->size()) +
                              " != consumed placeholder count " + std::to_string(next_image_));
    return Status::ok();
  }

  std::vector<Segment> take() { return std::move(out_); }

 private:
  void add(std::string_view t, bool special) {
    if (!t.empty()) out_.push_back(Segment{std::string(t), special});
  }

  const std::optional<std::vector<std::string>>& image_prompts_;
  size_t next_image_ = 0;
  std::vector<Segment> out_;
};

Result<std::string> tools_json(const std::vector<std::string>& tools) {
  std::vector<Json> items;
  for (size_t i = 0; i < tools.size(); ++i) {
    auto j = Json::parse(tools[i]);
    if (!j) return invalid_argument("tool declaration " + std::to_string(i) + ": " + j.error().message());
    items.push_back(std::move(*j));
  }
  return Json::array(std::move(items)).deep_sorted().dump(/*compact=*/true);
}

Status tool_declare(Writer& w, const std::vector<std::string>& tools, bool dynamic) {
  auto json = tools_json(tools);
  if (!json) return json.error();
  std::string body = dynamic ? "## New Tools Available\n"
                               "The system dynamically extends the toolset via lazy-loading.\n"
                               "You have access to all existing and extended tools.\n"
                               "Here are the specs for the extended tools.\n\n"
                             : "# Tools\nHere are the available tools, described in JSONSchema.\n\n";
  body += "```json\n" + *json + "\n```";
  w.internal_system("tool-declare", body);
  return Status::ok();
}

std::string_view xtml_type(const Json& v) {
  switch (v.type()) {
    case Json::Type::kBool: return "boolean";
    case Json::Type::kNull: return "null";
    case Json::Type::kInt:
    case Json::Type::kFloat: return "number";
    case Json::Type::kString: return "string";
    case Json::Type::kObject: return "object";
    case Json::Type::kArray: return "array";
  }
  return "array";
}

Status tool_calls(Writer& w, const std::vector<ToolCall>& calls) {
  w.open_tag("tools");
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& c = calls[i];
    w.open_tag("call", {{"tool", c.name}, {"index", std::to_string(i + 1)}});
    // The reference's normalize_tool_arguments: blank -> {}, unparsable -> raw `json` block, non-object -> error.
    if (!is_py_whitespace_only(c.arguments)) {
      auto args = Json::parse(c.arguments);
      if (!args) {
        w.open_tag("json", {{"type", "object"}});
        KESTREL_RETURN_IF_ERROR(w.append_text(c.arguments));
        w.close_tag("json");
      } else if (!args->is_object()) {
        return invalid_argument("tool call " + std::to_string(i + 1) + " (" + c.name +
                                "): arguments must be a JSON object");
      } else {
        for (const auto& [key, value] : args->members()) {
          w.open_tag("argument", {{"key", key}, {"type", std::string(xtml_type(value))}});
          KESTREL_RETURN_IF_ERROR(w.append_text(value.is_string() ? value.as_string() : value.dump()));
          w.close_tag("argument");
        }
      }
    }
    w.close_tag("call");
  }
  w.close_tag("tools");
  return Status::ok();
}

// The reference's normalize_xtml_tool_result_messages: each run of consecutive tool messages whose tool_call_ids
// all match the latest assistant's tool_calls is sorted into call order (stable) and takes the matched call's name.
// Returns (message index, name override) in render order.
std::vector<std::pair<size_t, std::optional<std::string>>> order_tool_results(const std::vector<Message>& msgs) {
  std::vector<std::pair<size_t, std::optional<std::string>>> out;
  std::vector<std::pair<std::string, std::pair<size_t, std::string>>> index;  // id -> (1-based position, name)
  size_t i = 0;
  while (i < msgs.size()) {
    const Message& m = msgs[i];
    if (m.role == Role::kAssistant) {
      index.clear();
      for (size_t p = 0; p < m.tool_calls.size(); ++p) {
        const auto& id = m.tool_calls[p].id;
        if (std::none_of(index.begin(), index.end(), [&](const auto& e) { return e.first == id; }))
          index.push_back({id, {p + 1, m.tool_calls[p].name}});
      }
    }
    if (m.role != Role::kTool) {
      out.push_back({i++, std::nullopt});
      continue;
    }
    struct Item {
      size_t position, offset, msg;
      std::string name;
    };
    std::vector<Item> run;
    bool unresolved = false;
    for (; i < msgs.size() && msgs[i].role == Role::kTool; ++i) {
      const auto& id = msgs[i].tool_call_id;
      auto it = id ? std::find_if(index.begin(), index.end(), [&](const auto& e) { return e.first == *id; })
                   : index.end();
      if (it == index.end()) {
        unresolved = true;
        run.push_back({0, run.size(), i, {}});
      } else {
        run.push_back({it->second.first, run.size(), i, it->second.second});
      }
    }
    if (unresolved) {
      for (const auto& r : run) out.push_back({r.msg, std::nullopt});
    } else {
      std::stable_sort(run.begin(), run.end(), [](const Item& a, const Item& b) { return a.position < b.position; });
      for (const auto& r : run) out.push_back({r.msg, r.name});
    }
  }
  return out;
}

}  // namespace

Result<std::vector<Segment>> render_k3_segments(const ChatRequest& req) {
  Writer w(req.image_prompts);
  if (!req.tools.empty()) KESTREL_RETURN_IF_ERROR(tool_declare(w, req.tools, /*dynamic=*/false));
  if (req.thinking && req.thinking_effort) {
    w.internal_system("thinking-effort",
                      std::string("`thinking_effort` guides on how much to think in your thinking channel (not "
                                  "including the response channel), supported values include `low`, `medium`, "
                                  "`high`, and `max`.\nNow the system is invoked with `thinking_effort=") +
                          std::string(effort_name(*req.thinking_effort)) + "`.");
  }

  const std::vector<ToolCall>* prior_calls = nullptr;
  size_t tool_index = 0;
  for (const auto& [mi, name_override] : order_tool_results(req.messages)) {
    const Message& m = req.messages[mi];
    switch (m.role) {
      case Role::kSystem:
        if (!m.tools.empty()) {
          KESTREL_RETURN_IF_ERROR(tool_declare(w, m.tools, /*dynamic=*/true));
          break;
        }
        [[fallthrough]];
      case Role::kUser: {
        std::vector<std::pair<std::string_view, std::string>> attrs{{"role", m.role == Role::kUser ? "user" : "system"}};
        if (m.name && !m.name->empty()) attrs.push_back({"name", *m.name});
        w.open_tag("message", attrs);
        KESTREL_RETURN_IF_ERROR(w.content(m));
        w.close_tag("message");
        w.end_of_msg();
        break;
      }
      case Role::kTool: {
        ++tool_index;
        std::optional<std::string> name = name_override ? name_override : m.name;
        if (!name && prior_calls && tool_index <= prior_calls->size()) name = (*prior_calls)[tool_index - 1].name;
        if (!name)
          return invalid_argument("message " + std::to_string(mi) +
                                  ": tool result needs a resolvable tool name (name, or a tool_call_id / position "
                                  "matching the preceding assistant's tool_calls)");
        w.open_tag("message", {{"role", "tool"}, {"tool", *name}, {"index", std::to_string(tool_index)}});
        KESTREL_RETURN_IF_ERROR(w.content(m));
        w.close_tag("message");
        w.end_of_msg();
        break;
      }
      case Role::kAssistant: {
        prior_calls = &m.tool_calls;
        tool_index = 0;
        std::vector<std::pair<std::string_view, std::string>> attrs{{"role", "assistant"}};
        if (m.name && !m.name->empty()) attrs.push_back({"name", *m.name});
        w.open_tag("message", attrs);
        if (req.thinking) {
          // Thinking history must be replayed; without it the reference renders an empty think channel.
          w.open_tag("think");
          if (m.reasoning_content && !is_py_whitespace_only(*m.reasoning_content))
            KESTREL_RETURN_IF_ERROR(w.append_text(*m.reasoning_content));
          w.close_tag("think");
        }
        w.open_tag("response");
        KESTREL_RETURN_IF_ERROR(w.content(m));
        w.close_tag("response");
        if (!m.tool_calls.empty()) KESTREL_RETURN_IF_ERROR(tool_calls(w, m.tool_calls));
        w.close_tag("message");
        w.end_of_msg();
        break;
      }
    }
  }

  if (req.tool_choice == ToolChoice::kRequired) {
    w.internal_system("tool-choice",
                      "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  } else if (req.tool_choice == ToolChoice::kNone) {
    w.internal_system("tool-choice",
                      "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next "
                      "message.");
  }
  constexpr std::string_view kRawJson =
      "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
  if (req.response_format.kind == ResponseFormat::Kind::kJsonObject) {
    w.internal_system("response-format",
                      std::string("The system is invoked with `response_format=json_object`.\n") + std::string(kRawJson));
  } else if (req.response_format.kind == ResponseFormat::Kind::kJsonSchema) {
    std::string schema = "null";
    if (!req.response_format.schema_json.empty()) {
      auto j = Json::parse(req.response_format.schema_json);
      if (!j) return invalid_argument("response_format schema: " + j.error().message());
      schema = j->deep_sorted().dump(/*compact=*/true);
    }
    w.internal_system("response-format", std::string("The system is invoked with `response_format=json_schema`.\n") +
                                             std::string(kRawJson) +
                                             "\nThe JSON data must match the following schema:\n```json\n" + schema +
                                             "\n```");
  }

  if (req.add_generation_prompt) {
    w.open_tag("message", {{"role", "assistant"}});
    w.open_tag(req.thinking ? "think" : "response");
  }
  KESTREL_RETURN_IF_ERROR(w.check_images_consumed());
  return w.take();
}

}  // namespace kestrel::chat
