#include "server/openai_schema.h"

#include <cmath>
#include <utility>

#include "chat/utf8.h"

namespace kestrel::server {

using nlohmann::json;

json ApiError::to_json() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", std::move(e)}};
}

std::string ApiError::body() const { return to_json().dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

namespace {

// Typed, range-checked field access on one JSON object. The first failure is kept in `err`; every getter
// returns false once an error is set, so callers can chain without checking each step. A null value counts
// as absent (OpenAI clients send explicit nulls for optional fields).
class Fields {
 public:
  Fields(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  std::optional<ApiError> err;
  bool ok() const { return !err; }

  const json* find(const char* key) const {
    auto it = obj_.find(key);
    return (it == obj_.end() || it->is_null()) ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }
  bool fail(const char* key, const std::string& what) {
    if (!err) err = bad_request("'" + name(key) + "' " + what, name(key));
    return false;
  }

  bool str(const char* key, std::string& out, size_t max_len = SIZE_MAX, bool required = false) {
    if (err) return false;
    const json* v = find(key);
    if (!v) return required ? fail(key, "is required") : true;
    if (!v->is_string()) return fail(key, "must be a string");
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max_len) return fail(key, "is too long");
    if (!chat::utf8_is_valid(s)) return fail(key, "is not valid UTF-8");
    out = s;
    return true;
  }
  bool boolean(const char* key, bool& out) {
    if (err) return false;
    const json* v = find(key);
    if (!v) return true;
    if (!v->is_boolean()) return fail(key, "must be a boolean");
    out = v->get<bool>();
    return true;
  }
  template <typename T>
  bool integer(const char* key, int64_t lo, int64_t hi, T& out) {
    if (err) return false;
    const json* v = find(key);
    if (!v) return true;
    int64_t x = 0;
    if (!as_int(*v, &x)) return fail(key, "must be an integer");
    if (x < lo || x > hi)
      return fail(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    out = static_cast<T>(x);
    return true;
  }
  bool number(const char* key, double lo, double hi, float& out, bool lo_open = false) {
    if (err) return false;
    const json* v = find(key);
    if (!v) return true;
    if (!v->is_number()) return fail(key, "must be a number");
    double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
      return fail(key, "must be " + std::string(lo_open ? "> " : ">= ") + num(lo) + " and <= " + num(hi));
    out = static_cast<float>(x);
    return true;
  }

  static bool as_int(const json& v, int64_t* out) {
    if (v.is_number_integer() && !v.is_number_unsigned()) { *out = v.get<int64_t>(); return true; }
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return false;
      *out = static_cast<int64_t>(u);
      return true;
    }
    if (v.is_number_float()) {  // 5.0 is accepted as 5; 5.5 and 1e300 are not
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
      *out = static_cast<int64_t>(d);
      return true;
    }
    return false;
  }
  static std::string num(double d) {
    std::string s = std::to_string(d);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

 private:
  const json& obj_;
  std::string prefix_;
};

bool parse_token_ids(const json& v, size_t max, int32_t hi, std::vector<int32_t>& out) {
  if (!v.is_array() || v.size() > max) return false;
  out.clear();
  out.reserve(v.size());
  for (const auto& e : v) {
    int64_t x = 0;
    if (!Fields::as_int(e, &x) || x < 0 || x > hi) return false;
    out.push_back(static_cast<int32_t>(x));
  }
  return true;
}

// Common prologue: parse the body, check `model`.
std::optional<ApiError> begin(std::string_view body, const SchemaLimits& lim, json& obj, std::string& model) {
  auto parsed = parse_json_object(body, lim.max_json_depth);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  obj = std::move(std::get<json>(parsed));
  Fields f(obj, "");
  f.str("model", model, 256);
  if (f.err) return f.err;
  if (!model.empty() && !lim.served_model.empty() && model != lim.served_model)
    return ApiError{404, "The model '" + model + "' does not exist", "invalid_request_error", "model",
                    "model_not_found"};
  return std::nullopt;
}

std::optional<ApiError> parse_sampling(const json& obj, const SchemaLimits& lim, bool chat, SamplingOptions& s) {
  Fields f(obj, "");
  f.number("temperature", 0.0, 2.0, s.temperature);
  f.number("top_p", 0.0, 1.0, s.top_p, /*lo_open=*/true);
  f.integer("top_k", -1, 1 << 20, s.top_k);
  if (s.top_k < 0) s.top_k = 0;
  f.number("min_p", 0.0, 1.0, s.min_p);
  f.integer("seed", INT64_MIN, INT64_MAX, s.seed.emplace());
  if (!f.find("seed")) s.seed.reset();
  f.number("presence_penalty", -2.0, 2.0, s.presence_penalty);
  f.number("frequency_penalty", -2.0, 2.0, s.frequency_penalty);
  f.number("repetition_penalty", 0.0, 10.0, s.repetition_penalty, /*lo_open=*/true);
  int max_tokens = -1;
  f.integer("max_tokens", 1, INT32_MAX, max_tokens);
  f.integer("max_completion_tokens", 1, INT32_MAX, max_tokens);
  if (max_tokens > 0) s.max_tokens = max_tokens;
  f.integer("n", 1, lim.max_n, s.n);
  f.boolean("ignore_eos", s.ignore_eos);
  f.boolean("stream", s.stream);
  f.str("user", s.user, 1024);
  f.str("cache_salt", s.cache_salt, 1024);
  f.str("bootstrap_host", s.bootstrap_host, 256);
  f.integer("bootstrap_port", 1, 65535, s.bootstrap_port);
  f.integer("bootstrap_room", 0, INT64_MAX, s.bootstrap_room);
  if (chat) {
    f.boolean("logprobs", s.logprobs);
    f.integer("top_logprobs", 0, lim.max_top_logprobs, s.top_logprobs);
    if (f.ok() && f.find("top_logprobs") && !s.logprobs)
      f.fail("top_logprobs", "requires 'logprobs' to be true");
  } else if (f.find("logprobs")) {  // completions: integer count of top logprobs
    f.integer("logprobs", 0, lim.max_top_logprobs, s.top_logprobs);
    s.logprobs = true;
  }
  if (f.err) return f.err;
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) return bad_request("'stream_options' must be an object", "stream_options");
    Fields g(*so, "stream_options.");
    g.boolean("include_usage", s.include_usage);
    if (g.err) return g.err;
    if (!s.stream) return bad_request("'stream_options' requires 'stream' to be true", "stream_options");
  }
  if (const json* st = f.find("stop")) {
    std::vector<const json*> items;
    if (st->is_string()) {
      items.push_back(st);
    } else if (st->is_array() && st->size() <= static_cast<size_t>(lim.max_stop)) {
      for (const auto& e : *st) items.push_back(&e);
    } else {
      return bad_request("'stop' must be a string or an array of at most " + std::to_string(lim.max_stop) +
                         " strings", "stop");
    }
    for (const json* e : items) {
      if (!e->is_string()) return bad_request("'stop' entries must be strings", "stop");
      const auto& str = e->get_ref<const std::string&>();
      if (str.empty() || str.size() > lim.max_stop_bytes || !chat::utf8_is_valid(str))
        return bad_request("'stop' entries must be 1.." + std::to_string(lim.max_stop_bytes) + " bytes", "stop");
      s.stop.push_back(str);
    }
  }
  if (const json* ids = f.find("stop_token_ids")) {
    if (!parse_token_ids(*ids, lim.max_stop_token_ids, INT32_MAX, s.stop_token_ids))
      return bad_request("'stop_token_ids' must be an array of non-negative token ids", "stop_token_ids");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_content(const json& c, const SchemaLimits& lim, const std::string& where,
                                      ChatMessage& m) {
  if (c.is_string()) {
    m.has_content = true;
    m.content = c.get<std::string>();
    if (!chat::utf8_is_valid(m.content)) return bad_request("'" + where + "' is not valid UTF-8", where);
    return std::nullopt;
  }
  if (!c.is_array() || c.size() > lim.max_parts)
    return bad_request("'" + where + "' must be a string or an array of content parts", where);
  m.has_content = true;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    std::string pw = where + "[" + std::to_string(i) + "]";
    if (!p.is_object()) return bad_request("'" + pw + "' must be an object", pw);
    Fields f(p, pw + ".");
    ContentPart part;
    std::string type;
    f.str("type", type, 64, /*required=*/true);
    if (f.err) return f.err;
    if (type == "text") {
      part.kind = ContentPart::Kind::kText;
      f.str("text", part.text, SIZE_MAX, /*required=*/true);
    } else if (type == "image_url") {
      part.kind = ContentPart::Kind::kImageUrl;
      const json* iu = f.find("image_url");
      if (iu && iu->is_string()) {
        f.str("image_url", part.url, SIZE_MAX, true);
      } else if (iu && iu->is_object()) {
        Fields g(*iu, pw + ".image_url.");
        g.str("url", part.url, SIZE_MAX, /*required=*/true);
        g.str("detail", part.detail, 16);
        if (g.ok() && !part.detail.empty() && part.detail != "auto" && part.detail != "low" &&
            part.detail != "high")
          g.fail("detail", "must be 'auto', 'low' or 'high'");
        if (g.err) return g.err;
        if (part.url.empty()) return bad_request("'" + pw + ".image_url.url' must not be empty", pw);
      } else {
        return bad_request("'" + pw + ".image_url' must be an object with 'url'", pw + ".image_url");
      }
    } else {
      return bad_request("'" + pw + ".type' must be 'text' or 'image_url'", pw + ".type");
    }
    if (f.err) return f.err;
    m.content_parts.push_back(std::move(part));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& obj, const SchemaLimits& lim, std::vector<ChatMessage>& out) {
  auto it = obj.find("messages");
  if (it == obj.end() || !it->is_array() || it->empty())
    return bad_request("'messages' must be a non-empty array", "messages");
  if (it->size() > lim.max_messages) return bad_request("'messages' has too many entries", "messages");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& mj = (*it)[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!mj.is_object()) return bad_request("'" + where + "' must be an object", where);
    Fields f(mj, where + ".");
    ChatMessage m;
    f.str("role", m.role, 32, /*required=*/true);
    f.str("name", m.name, 256);
    f.str("tool_call_id", m.tool_call_id, 256);
    f.str("reasoning_content", m.reasoning_content);
    if (f.err) return f.err;
    if (m.role != "system" && m.role != "developer" && m.role != "user" && m.role != "assistant" &&
        m.role != "tool")
      return bad_request("'" + where + ".role' must be system, developer, user, assistant or tool",
                         where + ".role");
    if (const json* c = f.find("content")) {
      if (auto e = parse_content(*c, lim, where + ".content", m)) return e;
    }
    if (const json* tc = f.find("tool_calls")) {
      if (m.role != "assistant" || !tc->is_array() || tc->size() > lim.max_tools)
        return bad_request("'" + where + ".tool_calls' must be an array on an assistant message",
                           where + ".tool_calls");
      for (size_t k = 0; k < tc->size(); ++k) {
        const json& cj = (*tc)[k];
        std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        const json* fn = cj.is_object() ? &cj : nullptr;
        auto fit = fn ? cj.find("function") : cj.end();
        if (!fn || fit == cj.end() || !fit->is_object())
          return bad_request("'" + cw + "' must be an object with 'function'", cw);
        Fields g(cj, cw + "."), h(*fit, cw + ".function.");
        ToolCall call;
        std::string type = "function";
        g.str("id", call.id, 256);
        g.str("type", type, 32);
        h.str("name", call.name, 256, /*required=*/true);
        h.str("arguments", call.arguments);
        if (g.err) return g.err;
        if (h.err) return h.err;
        if (type != "function") return bad_request("'" + cw + ".type' must be 'function'", cw + ".type");
        m.tool_calls.push_back(std::move(call));
      }
    }
    if (!m.has_content && m.tool_calls.empty() && m.role != "assistant")
      return bad_request("'" + where + ".content' is required", where + ".content");
    if (m.role == "tool" && m.tool_call_id.empty() && m.name.empty())
      return bad_request("'" + where + ".tool_call_id' is required for tool messages", where + ".tool_call_id");
    out.push_back(std::move(m));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const json& obj, const SchemaLimits& lim, ChatCompletionRequest& r) {
  Fields f(obj, "");
  if (const json* tools = f.find("tools")) {
    if (!tools->is_array() || tools->size() > lim.max_tools)
      return bad_request("'tools' must be an array of at most " + std::to_string(lim.max_tools) + " tools",
                         "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      std::string w = "tools[" + std::to_string(i) + "]";
      auto fit = t.is_object() ? t.find("function") : t.end();
      if (!t.is_object() || fit == t.end() || !fit->is_object())
        return bad_request("'" + w + "' must be an object with 'function'", w);
      Fields g(t, w + "."), h(*fit, w + ".function.");
      std::string type = "function";
      ToolDef d;
      g.str("type", type, 32);
      h.str("name", d.name, 256, /*required=*/true);
      h.str("description", d.description);
      h.boolean("strict", d.strict);
      if (g.err) return g.err;
      if (h.err) return h.err;
      if (type != "function") return bad_request("'" + w + ".type' must be 'function'", w + ".type");
      if (d.name.empty()) return bad_request("'" + w + ".function.name' must not be empty", w + ".function.name");
      if (const json* p = h.find("parameters")) {
        if (!p->is_object()) return bad_request("'" + w + ".function.parameters' must be an object", w);
        d.parameters = *p;
      }
      r.tools.push_back(std::move(d));
    }
  }
  if (const json* tc = f.find("tool_choice")) {
    if (tc->is_string()) {
      const auto& s = tc->get_ref<const std::string&>();
      if (s == "auto") r.tool_choice.mode = ToolChoice::Mode::kAuto;
      else if (s == "none") r.tool_choice.mode = ToolChoice::Mode::kNone;
      else if (s == "required") r.tool_choice.mode = ToolChoice::Mode::kRequired;
      else return bad_request("'tool_choice' must be 'auto', 'none', 'required' or a function", "tool_choice");
    } else if (tc->is_object()) {
      auto fit = tc->find("function");
      if (fit == tc->end() || !fit->is_object())
        return bad_request("'tool_choice.function' must be an object", "tool_choice");
      Fields h(*fit, "tool_choice.function.");
      h.str("name", r.tool_choice.name, 256, /*required=*/true);
      if (h.err) return h.err;
      r.tool_choice.mode = ToolChoice::Mode::kNamed;
      bool found = false;
      for (const auto& t : r.tools) found = found || t.name == r.tool_choice.name;
      if (!found) return bad_request("'tool_choice' names a function not in 'tools'", "tool_choice");
    } else {
      return bad_request("'tool_choice' must be a string or an object", "tool_choice");
    }
    if ((r.tool_choice.mode == ToolChoice::Mode::kRequired) && r.tools.empty())
      return bad_request("'tool_choice' is 'required' but no tools are given", "tool_choice");
  }
  return std::nullopt;
}

}  // namespace

std::variant<json, ApiError> parse_json_object(std::string_view body, int max_depth) {
  // Depth pre-scan outside strings: bounds the nesting before nlohmann builds anything.
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : body) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return bad_request("JSON nesting is too deep");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad_request("The request body is not valid JSON (or not valid UTF-8)");
  if (!j.is_object()) return bad_request("The request body must be a JSON object");
  return j;
}

std::variant<ChatCompletionRequest, ApiError> parse_chat_request(std::string_view body, const SchemaLimits& lim) {
  ChatCompletionRequest r;
  json obj;
  if (auto e = begin(body, lim, obj, r.model)) return *e;
  if (auto e = parse_messages(obj, lim, r.messages)) return *e;
  if (auto e = parse_tools(obj, lim, r)) return *e;
  if (auto e = parse_sampling(obj, lim, /*chat=*/true, r.sampling)) return *e;
  Fields f(obj, "");
  f.str("reasoning_effort", r.reasoning.effort, 16);
  f.boolean("thinking", r.reasoning.thinking);
  f.boolean("add_generation_prompt", r.add_generation_prompt);
  if (f.err) return *f.err;
  const std::string& eff = r.reasoning.effort;
  if (!eff.empty() && eff != "none" && eff != "minimal" && eff != "low" && eff != "medium" && eff != "high")
    return bad_request("'reasoning_effort' must be none, minimal, low, medium or high", "reasoning_effort");
  if (const json* kw = f.find("chat_template_kwargs")) {
    if (!kw->is_object()) return bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    Fields g(*kw, "chat_template_kwargs.");
    g.boolean("enable_thinking", r.reasoning.thinking);
    g.boolean("thinking", r.reasoning.thinking);
    if (g.err) return *g.err;
  }
  return r;
}

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, const SchemaLimits& lim) {
  CompletionRequest r;
  json obj;
  if (auto e = begin(body, lim, obj, r.model)) return *e;
  auto it = obj.find("prompt");
  const json* p = it == obj.end() ? nullptr : &*it;
  // A one-element batch ([string] or [[ids]]) is unwrapped; larger batches are not supported.
  if (p && p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p && p->is_string()) {
    r.prompt = p->get<std::string>();
    if (!chat::utf8_is_valid(r.prompt)) return bad_request("'prompt' is not valid UTF-8", "prompt");
  } else if (p && p->is_array() && !p->empty()) {
    r.prompt_is_tokens = true;
    if (!parse_token_ids(*p, lim.max_prompt_token_ids, INT32_MAX, r.prompt_ids))
      return bad_request("'prompt' must be a string or an array of token ids", "prompt");
  } else {
    return bad_request("'prompt' must be a string or a non-empty array of token ids", "prompt");
  }
  if (!r.prompt_is_tokens && r.prompt.empty()) return bad_request("'prompt' must not be empty", "prompt");
  Fields f(obj, "");
  f.boolean("echo", r.echo);
  if (f.err) return *f.err;
  if (auto e = parse_sampling(obj, lim, /*chat=*/false, r.sampling)) return *e;
  return r;
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body, const SchemaLimits& lim) {
  TokenizeRequest r;
  json obj;
  if (auto e = begin(body, lim, obj, r.model)) return *e;
  Fields f(obj, "");
  f.boolean("add_special_tokens", r.add_special_tokens);
  f.boolean("add_generation_prompt", r.add_generation_prompt);
  if (f.err) return *f.err;
  if (obj.contains("messages")) {
    r.has_messages = true;
    if (auto e = parse_messages(obj, lim, r.messages)) return *e;
    return r;
  }
  f.str("prompt", r.prompt, SIZE_MAX, /*required=*/true);
  if (f.err) return *f.err;
  return r;
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body, const SchemaLimits& lim) {
  DetokenizeRequest r;
  json obj;
  if (auto e = begin(body, lim, obj, r.model)) return *e;
  auto it = obj.find("tokens");
  if (it == obj.end() || !parse_token_ids(*it, lim.max_prompt_token_ids, INT32_MAX, r.tokens))
    return bad_request("'tokens' must be an array of non-negative token ids", "tokens");
  return r;
}

}  // namespace kestrel::server
