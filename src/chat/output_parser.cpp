#include "chat/output_parser.h"

#include <algorithm>
#include <optional>

#include "chat/json.h"

namespace kestrel::chat {

void ParseDelta::append(const ParseDelta& d) {
  reasoning_content += d.reasoning_content;
  content += d.content;
  tool_calls.insert(tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  finished = finished || d.finished;
}

namespace {

// K3 markers.
constexpr std::string_view kThinkOpen = "<|open|>think<|sep|>";
constexpr std::string_view kThinkClose = "<|close|>think<|sep|>";
constexpr std::string_view kRespOpen = "<|open|>response<|sep|>";
constexpr std::string_view kRespClose = "<|close|>response<|sep|>";
constexpr std::string_view kToolsOpen = "<|open|>tools<|sep|>";
constexpr std::string_view kToolsClose = "<|close|>tools<|sep|>";
constexpr std::string_view kMsgClose = "<|close|>message<|sep|>";
constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";
constexpr std::string_view kCallOpen = "<|open|>call";
constexpr std::string_view kCallClose = "<|close|>call<|sep|>";
constexpr std::string_view kOpen = "<|open|>";
constexpr std::string_view kSep = "<|sep|>";
// K2 markers.
constexpr std::string_view kK2ThinkOpen = "<think>";
constexpr std::string_view kK2ThinkClose = "</think>";
constexpr std::string_view kK2SectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kK2SectionBeginAlt = "<|tool_call_section_begin|>";
constexpr std::string_view kK2SectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kK2SectionEndAlt = "<|tool_call_section_end|>";
constexpr std::string_view kK2CallBegin = "<|tool_call_begin|>";
constexpr std::string_view kK2ArgBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kK2CallEnd = "<|tool_call_end|>";
constexpr std::string_view kK2End = "<|im_end|>";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

std::string_view trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string unescape_attr(std::string_view v) {  // inverse of `&`->`&amp;` then `"`->`&quot;`
  std::string out;
  for (size_t i = 0; i < v.size();) {
    if (v.substr(i, 6) == "&quot;") out += '"', i += 6;
    else if (v.substr(i, 5) == "&amp;") out += '&', i += 5;
    else out += v[i++];
  }
  return out;
}

// ` k="v" k2="v2"` -> pairs; nullopt if not of that shape.
std::optional<std::vector<std::pair<std::string, std::string>>> parse_attrs(std::string_view s) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!s.empty()) {
    if (s[0] != ' ') return std::nullopt;
    s.remove_prefix(1);
    const size_t eq = s.find("=\"");
    if (eq == std::string_view::npos || eq == 0) return std::nullopt;
    const std::string key(s.substr(0, eq));
    if (key.find_first_of(" \"") != std::string::npos) return std::nullopt;
    s.remove_prefix(eq + 2);
    const size_t q = s.find('"');
    if (q == std::string_view::npos) return std::nullopt;
    out.emplace_back(key, unescape_attr(s.substr(0, q)));
    s.remove_prefix(q + 1);
  }
  return out;
}

const std::string* attr(const std::vector<std::pair<std::string, std::string>>& a, std::string_view key) {
  for (const auto& [k, v] : a)
    if (k == key) return &v;
  return nullptr;
}

// Parses `<|open|>TAG ATTRS<|sep|>BODY<|close|>TAG<|sep|>` at the front of `s`; advances `s` past it.
struct Element {
  std::vector<std::pair<std::string, std::string>> attrs;
  std::string_view body;
};
std::optional<Element> take_element(std::string_view& s, std::string_view tag) {
  std::string open = std::string(kOpen) + std::string(tag);
  if (!starts_with(s, open)) return std::nullopt;
  std::string_view rest = s.substr(open.size());
  const size_t sep = rest.find(kSep);
  if (sep == std::string_view::npos) return std::nullopt;
  auto attrs = parse_attrs(rest.substr(0, sep));
  if (!attrs) return std::nullopt;
  rest.remove_prefix(sep + kSep.size());
  const std::string close = "<|close|>" + std::string(tag) + std::string(kSep);
  const size_t end = rest.find(close);
  if (end == std::string_view::npos) return std::nullopt;
  Element e{std::move(*attrs), rest.substr(0, end)};
  s = rest.substr(end + close.size());
  return e;
}

// Value text of an argument of declared `type` as JSON.
std::string argument_json(std::string_view type, std::string_view value) {
  std::string out;
  if (type != "string") {
    auto j = Json::parse(value);
    if (j) {
      const std::string_view t = trim(value);
      return std::string(t);
    }
  }
  append_json_string(out, value);
  return out;
}

// K3 call body (after the call's header) -> arguments JSON text, or nullopt if malformed.
std::optional<std::string> k3_arguments(std::string_view body) {
  if (body.empty()) return std::string("{}");
  if (starts_with(body, "<|open|>json")) {
    auto e = take_element(body, "json");
    if (!e || !body.empty()) return std::nullopt;
    return std::string(e->body);
  }
  std::string out = "{";
  bool first = true;
  while (!body.empty()) {
    auto e = take_element(body, "argument");
    if (!e) return std::nullopt;
    const std::string* key = attr(e->attrs, "key");
    const std::string* type = attr(e->attrs, "type");
    if (!key) return std::nullopt;
    if (!first) out += ", ";
    first = false;
    append_json_string(out, *key);
    out += ": ";
    out += argument_json(type ? std::string_view(*type) : std::string_view("string"), e->body);
  }
  return out + "}";
}

}  // namespace

OutputParser::OutputParser(OutputParserOptions options) : opt_(std::move(options)) {
  if (opt_.format == OutputFormat::kKimiK2) {
    state_ = State::kK2Start;
  } else {
    state_ = opt_.starts_in_reasoning ? State::kReasoning : State::kContent;
  }
  text_channel_ = state_ == State::kReasoning ? State::kReasoning : State::kContent;
}

ParseDelta OutputParser::push(std::string_view text) {
  ParseDelta out;
  if (state_ == State::kDone) return out;
  buf_.append(text);
  run(out, /*at_end=*/false);
  return out;
}

ParseDelta OutputParser::finish() {
  ParseDelta out;
  if (state_ == State::kDone) return out;
  run(out, /*at_end=*/true);
  if (!buf_.empty()) emit(out, buf_), buf_.clear();  // whatever is left cannot be structure any more
  return out;
}

void OutputParser::run(ParseDelta& out, bool at_end) {
  while (state_ != State::kDone && !buf_.empty() && step(out, at_end)) {
  }
  if (state_ == State::kDone) buf_.clear();
}

void OutputParser::emit(ParseDelta& out, std::string_view text) {
  if (text.empty()) return;
  if (text_channel_ == State::kReasoning) out.reasoning_content.append(text);
  else out.content.append(text);
}

void OutputParser::emit_call(ParseDelta& out, std::string name, std::string id, std::string arguments) {
  out.tool_calls.push_back(ToolCallDelta{calls_, std::move(id), std::move(name), std::move(arguments)});
  ++calls_;
}

void OutputParser::enter(State s, ParseDelta& out) {
  state_ = s;
  if (s == State::kReasoning || s == State::kContent) text_channel_ = s;
  if (s == State::kDone) out.finished = true;
}

bool OutputParser::step(ParseDelta& out, bool at_end) {
  const bool k3 = opt_.format == OutputFormat::kKimiK3;
  switch (state_) {
    case State::kK2Start:
      if (starts_with(buf_, kK2ThinkOpen)) {
        buf_.erase(0, kK2ThinkOpen.size());
        enter(State::kReasoning, out);
        return true;
      }
      if (!at_end && starts_with(kK2ThinkOpen, buf_)) return false;
      enter(State::kContent, out);
      return true;
    case State::kReasoning:
      if (k3)
        return text_state(out, at_end, {{kThinkClose, State::kBetween}, {kRespOpen, State::kContent},
                                        {kToolsOpen, State::kTools}, {kMsgClose, State::kAfterMessage},
                                        {kEndOfMsg, State::kDone}});
      return text_state(out, at_end, {{kK2ThinkClose, State::kContent}, {kK2SectionBegin, State::kTools},
                                      {kK2SectionBeginAlt, State::kTools}, {kK2End, State::kDone}});
    case State::kContent:
      if (k3)
        return text_state(out, at_end, {{kRespClose, State::kBetween}, {kToolsOpen, State::kTools},
                                        {kMsgClose, State::kAfterMessage}, {kEndOfMsg, State::kDone}});
      return text_state(out, at_end, {{kK2SectionBegin, State::kTools}, {kK2SectionBeginAlt, State::kTools},
                                      {kK2End, State::kDone}});
    case State::kBetween:
      return expect_state(out, at_end, {{kRespOpen, State::kContent}, {kToolsOpen, State::kTools},
                                        {kThinkOpen, State::kReasoning}, {kMsgClose, State::kAfterMessage},
                                        {kEndOfMsg, State::kDone}});
    case State::kAfterMessage:
      return expect_state(out, at_end, {{kEndOfMsg, State::kDone}});
    case State::kTools:
      return k3 ? k3_tools(out, at_end) : k2_tools(out, at_end);
    case State::kDone:
      return false;
  }
  return false;
}

// Plain text up to the earliest terminator; holds back a tail that could start one.
bool OutputParser::text_state(ParseDelta& out, bool at_end, const std::vector<Term>& terms) {
  size_t best = std::string::npos;
  const Term* hit = nullptr;
  for (const auto& t : terms) {
    const size_t p = buf_.find(t.marker);
    if (p < best) best = p, hit = &t;
  }
  if (hit) {
    emit(out, std::string_view(buf_).substr(0, best));
    buf_.erase(0, best + hit->marker.size());
    enter(hit->next, out);
    return true;
  }
  size_t hold = 0;
  if (!at_end)
    for (const auto& t : terms) hold = std::max(hold, partial_suffix(buf_, t.marker));
  emit(out, std::string_view(buf_).substr(0, buf_.size() - hold));
  buf_.erase(0, buf_.size() - hold);
  return false;
}

// Between sections: one of the markers must follow; anything else degrades to content.
bool OutputParser::expect_state(ParseDelta& out, bool at_end, const std::vector<Term>& terms) {
  for (const auto& t : terms) {
    if (starts_with(buf_, t.marker)) {
      buf_.erase(0, t.marker.size());
      enter(t.next, out);
      return true;
    }
  }
  if (!at_end)
    for (const auto& t : terms)
      if (starts_with(t.marker, buf_)) return false;  // could still become this marker
  enter(State::kContent, out);
  return true;
}

bool OutputParser::k3_tools(ParseDelta& out, bool at_end) {
  if (starts_with(buf_, kCallOpen) && buf_.size() > kCallOpen.size() &&
      (buf_[kCallOpen.size()] == ' ' || buf_[kCallOpen.size()] == '<')) {
    const size_t end = buf_.find(kCallClose);
    if (end == std::string::npos) {
      if (!at_end) return false;
      enter(State::kContent, out);  // truncated call: verbatim content
      return true;
    }
    std::string_view call = std::string_view(buf_).substr(kCallOpen.size(), end - kCallOpen.size());
    const size_t sep = call.find(kSep);
    std::optional<std::vector<std::pair<std::string, std::string>>> attrs;
    if (sep != std::string_view::npos) attrs = parse_attrs(call.substr(0, sep));
    const std::string* name = attrs ? attr(*attrs, "tool") : nullptr;
    std::optional<std::string> args;
    if (name) args = k3_arguments(call.substr(sep + kSep.size()));
    if (!args) {  // malformed call: its text becomes content, and so does the rest
      enter(State::kContent, out);
      return true;
    }
    emit_call(out, *name, opt_.id_prefix + std::to_string(calls_), std::move(*args));
    buf_.erase(0, end + kCallClose.size());
    return true;
  }
  if (!at_end && buf_.size() <= kCallOpen.size() && starts_with(kCallOpen, buf_)) return false;  // maybe a call
  return expect_state(out, at_end, {{kToolsClose, State::kBetween}, {kMsgClose, State::kAfterMessage},
                                    {kEndOfMsg, State::kDone}});
}

bool OutputParser::k2_tools(ParseDelta& out, bool at_end) {
  const size_t lead = buf_.find_first_not_of(" \n\t\r");
  if (lead == std::string::npos) {
    if (!at_end) return false;
    buf_.clear();
    return false;
  }
  if (lead > 0) buf_.erase(0, lead);
  if (starts_with(buf_, kK2CallBegin)) {
    const size_t end = buf_.find(kK2CallEnd);
    if (end == std::string::npos) {
      if (!at_end) return false;
      enter(State::kContent, out);
      return true;
    }
    std::string_view call = std::string_view(buf_).substr(kK2CallBegin.size(), end - kK2CallBegin.size());
    const size_t arg = call.find(kK2ArgBegin);
    if (arg == std::string_view::npos) {
      enter(State::kContent, out);
      return true;
    }
    const std::string id(trim(call.substr(0, arg)));
    std::string_view name = id;
    if (starts_with(name, "functions.")) name.remove_prefix(10);
    const size_t colon = name.rfind(':');
    if (colon != std::string_view::npos && colon + 1 < name.size() &&
        std::all_of(name.begin() + colon + 1, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      name = name.substr(0, colon);
    emit_call(out, std::string(name), id, std::string(trim(call.substr(arg + kK2ArgBegin.size()))));
    buf_.erase(0, end + kK2CallEnd.size());
    return true;
  }
  return expect_state(out, at_end, {{kK2SectionEnd, State::kContent}, {kK2SectionEndAlt, State::kContent},
                                    {kK2CallBegin, State::kTools}, {kK2End, State::kDone}});
}

}  // namespace kestrel::chat
