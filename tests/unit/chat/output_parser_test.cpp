// Streaming output parser: golden streams (complete, truncated, malformed) fed whole, split at every byte
// boundary, and byte by byte must all give the same OpenAI fields.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/output_parser.h"

namespace kestrel::chat {
namespace {

struct Golden {
  const char* name;
  OutputParserOptions options;
  std::string stream;
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool finished;
};

OutputParserOptions k3(bool reasoning = true) { return {OutputFormat::kKimiK3, reasoning, "call_"}; }
OutputParserOptions k2() { return {OutputFormat::kKimiK2, true, "call_"}; }

const std::string kEnd = "<|close|>message<|sep|><|end_of_msg|>";
const std::string kResp = "<|close|>think<|sep|><|open|>response<|sep|>";

std::vector<Golden> goldens() {
  return {
      {"k3_plain", k3(), "Let me think.<|close|>think<|sep|><|open|>response<|sep|>Hello world<|close|>response<|sep|>" + kEnd,
       "Let me think.", "Hello world", {}, true},
      {"k3_thinking_off", k3(false), "Hi there<|close|>response<|sep|>" + kEnd, "", "Hi there", {}, true},
      {"k3_no_closers", k3(), "r<|open|>response<|sep|>c<|end_of_msg|>", "r", "c", {}, true},
      {"k3_all_types",
       k3(),
       "use tool" + kResp + "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"all_types\" index=\"1\"<|sep|>"
       "<|open|>argument key=\"s\" type=\"string\"<|sep|>he said \"hi\"\n\t<|close|>argument<|sep|>"
       "<|open|>argument key=\"n\" type=\"number\"<|sep|>3.5<|close|>argument<|sep|>"
       "<|open|>argument key=\"b\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
       "<|open|>argument key=\"z\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
       "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"a\": [1, {}]}<|close|>argument<|sep|>"
       "<|open|>argument key=\"a\" type=\"array\"<|sep|>[1, \"x\"]<|close|>argument<|sep|>"
       "<|close|>call<|sep|><|close|>tools<|sep|>" + kEnd,
       "use tool", "",
       {{0, "call_0", "all_types",
         "{\"s\": \"he said \\\"hi\\\"\\n\\t\", \"n\": 3.5, \"b\": true, \"z\": null, \"o\": {\"a\": [1, {}]}, "
         "\"a\": [1, \"x\"]}"}},
       true},
      {"k3_two_calls_json_block_escaped_name",
       k3(),
       kResp + "ok<|close|>response<|sep|><|open|>tools<|sep|>"
               "<|open|>call tool=\"a&quot;b&amp;c\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{raw<|close|>json<|sep|><|close|>call<|sep|>"
               "<|open|>call tool=\"g\" index=\"2\"<|sep|><|close|>call<|sep|>"
               "<|close|>tools<|sep|>" + kEnd,
       "", "ok", {{0, "call_0", "a\"b&c", "{raw"}, {1, "call_1", "g", "{}"}}, true},
      {"k3_bad_number_quoted", k3(false),
       "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
       "<|open|>argument key=\"k&amp;\" type=\"number\"<|sep|>twelve<|close|>argument<|sep|><|close|>call<|sep|>"
       "<|close|>tools<|sep|>" + kEnd,
       "", "", {{0, "call_0", "f", "{\"k&\": \"twelve\"}"}}, true},
      {"k3_truncated_in_marker", k3(), "abc<|close|>thi", "abc<|close|>thi", "", {}, false},
      {"k3_truncated_in_call", k3(),
       "r" + kResp + "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\"",
       "r", "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\"", {}, false},
      {"k3_malformed_call_no_tool", k3(false),
       "x<|close|>response<|sep|><|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|>" + kEnd,
       "", "x<|open|>call index=\"1\"<|sep|><|close|>call<|sep|>", {}, true},
      {"k3_garbage_between_sections", k3(), "r<|close|>think<|sep|>oops<|end_of_msg|>", "r", "oops", {}, true},
      {"k3_after_end_ignored", k3(false), "done<|end_of_msg|>trailing <|open|>", "", "done", {}, true},
      {"k3_unicode", k3(), "思考🌍<|close|>think<|sep|><|open|>response<|sep|>é<|end_of_msg|>", "思考🌍", "é", {}, true},
      {"k3_lone_marker_prefix", k3(false), "a <| b <|open c", "", "a <| b <|open c", {}, false},
      {"k2_plain", k2(), "Hello<|im_end|>", "", "Hello", {}, true},
      {"k2_thinking", k2(), "<think>hmm</think>answer<|im_end|>", "hmm", "answer", {}, true},
      {"k2_tool_calls", k2(),
       "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
       "{\"city\": \"Paris\"}<|tool_call_end|> <|tool_call_begin|> functions.search:1 <|tool_call_argument_begin|>{}"
       "<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
       "", "Let me check.",
       {{0, "functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"}, {1, "functions.search:1", "search", "{}"}},
       true},
      {"k2_truncated_think_prefix", k2(), "<thi", "", "<thi", {}, false},
      {"k2_malformed_call", k2(),
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0{}<|tool_call_end|><|im_end|>", "",
       "<|tool_call_begin|>functions.f:0{}<|tool_call_end|>", {}, true},
      {"k2_truncated_call", k2(), "a<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_arg", "",
       "a<|tool_call_begin|>functions.f:0<|tool_call_arg", {}, false},
  };
}

ParseDelta run_chunks(const OutputParserOptions& o, const std::vector<std::string_view>& chunks) {
  OutputParser p(o);
  ParseDelta all;
  int next_index = 0;
  for (auto c : chunks) {
    ParseDelta d = p.push(c);
    for (const auto& tc : d.tool_calls) EXPECT_EQ(tc.index, next_index++);
    all.append(d);
  }
  all.append(p.finish());
  return all;
}

void expect_fields(const Golden& g, const ParseDelta& got, const std::string& how) {
  EXPECT_EQ(got.reasoning_content, g.reasoning) << g.name << " " << how;
  EXPECT_EQ(got.content, g.content) << g.name << " " << how;
  EXPECT_EQ(got.tool_calls, g.calls) << g.name << " " << how;
  EXPECT_EQ(got.finished, g.finished) << g.name << " " << how;
}

TEST(OutputParser, GoldenStreamsWhole) {
  for (const auto& g : goldens()) expect_fields(g, run_chunks(g.options, {g.stream}), "whole");
}

TEST(OutputParser, GoldenStreamsSplitAtEveryByte) {
  for (const auto& g : goldens()) {
    const std::string_view s = g.stream;
    for (size_t k = 0; k <= s.size(); ++k)
      expect_fields(g, run_chunks(g.options, {s.substr(0, k), s.substr(k)}), "split at " + std::to_string(k));
    std::vector<std::string_view> bytes;
    for (size_t k = 0; k < s.size(); ++k) bytes.push_back(s.substr(k, 1));
    expect_fields(g, run_chunks(g.options, bytes), "byte by byte");
  }
}

TEST(OutputParser, HoldsBackOnlyPossibleMarkers) {
  OutputParser p(k3(false));
  EXPECT_EQ(p.push("Hello <|clo").content, "Hello ");
  EXPECT_EQ(p.push("ud|> x").content, "<|cloud|> x");
  ParseDelta d = p.push("<|end_of_msg|>");
  EXPECT_TRUE(d.finished);
  EXPECT_TRUE(p.finished());
  EXPECT_TRUE(p.push("more").empty());
}

}  // namespace
}  // namespace kestrel::chat
