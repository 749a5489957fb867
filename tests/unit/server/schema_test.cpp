#include "server/openai_schema.h"

#include <gtest/gtest.h>

namespace kestrel::server {
namespace {

SchemaLimits limits() {
  SchemaLimits l;
  l.served_model = "kimi-k3";
  return l;
}

ChatCompletionRequest chat_ok(const std::string& body) {
  auto r = parse_chat_request(body, limits());
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<ChatCompletionRequest>(r) ? std::get<ChatCompletionRequest>(r)
                                                          : ChatCompletionRequest{};
}

ApiError chat_err(const std::string& body) {
  auto r = parse_chat_request(body, limits());
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(r);
}

const char* kMsg = R"("messages":[{"role":"user","content":"hi"}])";

TEST(Schema, MinimalChat) {
  auto r = chat_ok(std::string("{") + kMsg + "}");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_FALSE(r.sampling.max_tokens.has_value());
  EXPECT_TRUE(r.reasoning.thinking);
}

TEST(Schema, FullChat) {
  auto r = chat_ok(R"({"model":"kimi-k3","messages":[
      {"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA","detail":"low"}}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"}],
    "tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"f"}},
    "reasoning_effort":"high","chat_template_kwargs":{"thinking":false},
    "stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":77,"max_tokens":5,
    "temperature":0.5,"top_p":0.9,"top_k":-1,"min_p":0.05,"seed":-3,"stop":["a","b"],"n":3,
    "logprobs":true,"top_logprobs":5,"presence_penalty":1.5,"frequency_penalty":-1,"repetition_penalty":1.1,
    "ignore_eos":true,"user":"u","unknown_field":{"x":[1,2,3]}})");
  ASSERT_EQ(r.messages.size(), 4u);
  ASSERT_EQ(r.messages[1].content_parts.size(), 2u);
  EXPECT_EQ(r.messages[1].content_parts[1].kind, ContentPart::Kind::kImageUrl);
  EXPECT_EQ(r.messages[1].content_parts[1].detail, "low");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "f");
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kNamed);
  EXPECT_EQ(r.reasoning.effort, "high");
  EXPECT_FALSE(r.reasoning.thinking);
  EXPECT_TRUE(r.sampling.stream && r.sampling.include_usage);
  EXPECT_EQ(*r.sampling.max_tokens, 77);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(*r.sampling.seed, -3);
  EXPECT_EQ(r.sampling.stop.size(), 2u);
  EXPECT_EQ(r.sampling.n, 3);
  EXPECT_EQ(r.sampling.top_logprobs, 5);
  EXPECT_TRUE(r.sampling.ignore_eos);
}

TEST(Schema, TopLevelThinkingAndStopString) {
  auto r = chat_ok(std::string("{") + kMsg + R"(,"thinking":false,"stop":"END","temperature":0,"seed":5.0})");
  EXPECT_FALSE(r.reasoning.thinking);
  ASSERT_EQ(r.sampling.stop.size(), 1u);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(*r.sampling.seed, 5);
}

TEST(Schema, NullsCountAsAbsent) {
  auto r = chat_ok(std::string("{") + kMsg + R"(,"temperature":null,"stop":null,"tools":null,"n":null})");
  EXPECT_EQ(r.sampling.n, 1);
}

TEST(Schema, InvalidFieldsNameTheParam) {
  struct Case {
    std::string extra, param;
  };
  std::vector<Case> cases = {
      {R"("n":0)", "n"}, {R"("n":9)", "n"}, {R"("n":"2")", "n"}, {R"("n":1.5)", "n"},
      {R"("temperature":-0.1)", "temperature"}, {R"("temperature":2.5)", "temperature"},
      {R"("temperature":"hot")", "temperature"}, {R"("top_p":0)", "top_p"}, {R"("top_p":1.1)", "top_p"},
      {R"("top_k":-2)", "top_k"}, {R"("min_p":2)", "min_p"}, {R"("max_tokens":0)", "max_tokens"},
      {R"("max_tokens":-5)", "max_tokens"}, {R"("max_completion_tokens":1e12)", "max_completion_tokens"},
      {R"("stop":[1])", "stop"}, {R"("stop":[""])", "stop"},
      {R"("stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])", "stop"},
      {R"("logprobs":"yes")", "logprobs"}, {R"("top_logprobs":3)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":21)", "top_logprobs"}, {R"("presence_penalty":3)", "presence_penalty"},
      {R"("repetition_penalty":0)", "repetition_penalty"}, {R"("stream":1)", "stream"},
      {R"("stream_options":{"include_usage":true})", "stream_options"}, {R"("tools":{})", "tools"},
      {R"("tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name"},
      {R"("tools":[{"type":"retrieval","function":{"name":"f"}}])", "tools[0].type"},
      {R"("tool_choice":"sometimes")", "tool_choice"}, {R"("tool_choice":"required")", "tool_choice"},
      {R"("tool_choice":{"type":"function","function":{"name":"g"}})", "tool_choice"},
      {R"("reasoning_effort":"max")", "reasoning_effort"}, {R"("chat_template_kwargs":[])", "chat_template_kwargs"},
      {R"("chat_template_kwargs":{"thinking":"no"})", "chat_template_kwargs.thinking"},
      {R"("seed":"1")", "seed"}, {R"("stop_token_ids":[-1])", "stop_token_ids"}, {R"("user":5)", "user"},
  };
  for (const auto& c : cases) {
    auto e = chat_err(std::string("{") + kMsg + "," + c.extra + "}");
    EXPECT_EQ(e.status, 400) << c.extra;
    EXPECT_EQ(e.param, c.param) << c.extra;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
}

TEST(Schema, InvalidMessages) {
  for (const char* body : {
           R"({})", R"({"messages":[]})", R"({"messages":{}})", R"({"messages":[1]})",
           R"({"messages":[{"content":"x"}]})", R"({"messages":[{"role":"robot","content":"x"}]})",
           R"({"messages":[{"role":"user"}]})", R"({"messages":[{"role":"user","content":5}]})",
           R"({"messages":[{"role":"user","content":[{"type":"audio"}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x","detail":"ultra"}}]}]})",
           R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})",
           R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]})",
           R"({"messages":[{"role":"tool","content":"x"}]})", R"([1,2])", R"("str")", R"({"messages":)",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
           R"({"messages":[{"role":"user","content":"\ud800"}]})"}) {
    auto e = chat_err(body);
    EXPECT_EQ(e.status, 400) << body;
  }
}

TEST(Schema, ModelMismatchIs404) {
  auto e = chat_err(std::string("{\"model\":\"gpt-4\",") + kMsg + "}");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  auto j = e.to_json();
  EXPECT_EQ(j["error"]["param"], "model");
}

TEST(Schema, DeepNestingRejected) {
  std::string deep(100000, '[');
  auto e = chat_err(std::string("{") + kMsg + ",\"x\":" + deep + "}");
  EXPECT_EQ(e.status, 400);
}

TEST(Schema, Completions) {
  auto r = parse_completion_request(R"({"prompt":"hello","logprobs":2,"echo":true,"max_tokens":3})", limits());
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  auto& c = std::get<CompletionRequest>(r);
  EXPECT_EQ(c.prompt, "hello");
  EXPECT_TRUE(c.sampling.logprobs);
  EXPECT_EQ(c.sampling.top_logprobs, 2);
  EXPECT_TRUE(c.echo);
  auto t = parse_completion_request(R"({"prompt":[[1,2,3]]})", limits());
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(t));
  EXPECT_EQ(std::get<CompletionRequest>(t).prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  for (const char* bad : {R"({})", R"({"prompt":""})", R"({"prompt":[]})", R"({"prompt":[-1]})",
                          R"({"prompt":[1.5]})", R"({"prompt":["a","b"]})", R"({"prompt":5})",
                          R"({"prompt":"x","logprobs":true})", R"({"prompt":"x","logprobs":50})"}) {
    EXPECT_TRUE(std::holds_alternative<ApiError>(parse_completion_request(bad, limits()))) << bad;
  }
}

TEST(Schema, TokenizeDetokenize) {
  auto t = parse_tokenize_request(R"({"prompt":"a b","add_special_tokens":false})", limits());
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_FALSE(std::get<TokenizeRequest>(t).add_special_tokens);
  auto m = parse_tokenize_request(R"({"messages":[{"role":"user","content":"x"}]})", limits());
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(m));
  EXPECT_TRUE(std::get<TokenizeRequest>(m).has_messages);
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_tokenize_request(R"({"prompt":1})", limits())));
  auto d = parse_detokenize_request(R"({"tokens":[1,2]})", limits());
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(d));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_detokenize_request(R"({"tokens":"x"})", limits())));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_detokenize_request(R"({"tokens":[3e9]})", limits())));
}

}  // namespace
}  // namespace kestrel::server
