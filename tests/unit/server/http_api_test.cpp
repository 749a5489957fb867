// In-process HTTP server on an ephemeral loopback port against the fake engine and the trivial format.
#include <gtest/gtest.h>

#include <mutex>

#include <nlohmann/json.hpp>

#include "common/vocab_path.h"
#include "server/api_handlers.h"
#include "server/http_server.h"
#include "test_support.h"

namespace kestrel::server {
namespace {

using nlohmann::json;
using testing::FakeEngine;
using testing::RawClient;
using testing::TrivialFormat;
using testing::http_post;

const chat::Tokenizer& tokenizer() {
  static chat::Tokenizer* tok = [] {
    auto t = chat::Tokenizer::create(chat::cl100k_config(kestrel::testing::vocab_file("cl100k_base")));
    if (!t) throw std::runtime_error(t.error().message());
    return new chat::Tokenizer(std::move(*t));
  }();
  return *tok;
}

constexpr const char* kScript = "Hello world, this is a test of the streaming server.";

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { start(""); }
  void start(const std::string& key) {
    server_.reset();
    api_.reset();
    engine_ = std::make_unique<FakeEngine>(tokenizer().encode(kScript, chat::SpecialMode::kAsText));
    format_ = std::make_unique<TrivialFormat>(tokenizer());
    ApiConfig cfg;
    cfg.api_key = key;
    cfg.liveness = [this] {
      std::lock_guard<std::mutex> lock(liveness_mu_);
      return liveness_;
    };
    api_ = std::make_unique<ApiServer>(cfg, *engine_, tokenizer(), *format_);
    HttpServerOptions opt;
    opt.port = 0;
    opt.max_body_bytes = 64 * 1024;
    opt.read_timeout = std::chrono::milliseconds(2000);
    opt.shutdown_grace = std::chrono::milliseconds(500);
    server_ = std::make_unique<HttpServer>(opt, api_->make_router());
    ASSERT_TRUE(server_->start().is_ok());
  }
  void TearDown() override {
    server_.reset();
    api_.reset();
    engine_.reset();
  }
  void set_liveness(const std::string& why) {
    std::lock_guard<std::mutex> lock(liveness_mu_);
    liveness_ = why;
  }
  std::mutex liveness_mu_;
  std::string liveness_;  // what ApiConfig::liveness answers
  RawClient::Response post(const std::string& path, const std::string& body, const std::string& extra = {}) {
    RawClient c(server_->port());
    EXPECT_TRUE(c.ok());
    c.send(http_post(path, body, extra));
    return c.read_response();
  }
  RawClient::Response get(const std::string& path, const std::string& extra = {}) {
    RawClient c(server_->port());
    c.send("GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n");
    return c.read_response();
  }
  // SSE body → the JSON events (without [DONE]); sets *done if [DONE] was last.
  static std::vector<json> events(const std::string& body, bool* done) {
    std::vector<json> out;
    *done = false;
    size_t pos = 0;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
      size_t end = body.find("\n\n", pos);
      std::string payload = body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (payload == "[DONE]") {
        *done = true;
        continue;
      }
      out.push_back(json::parse(payload));
    }
    return out;
  }
  std::string decoded(int n) {
    auto ids = tokenizer().encode(kScript, chat::SpecialMode::kAsText);
    ids.resize(std::min<size_t>(ids.size(), n));
    return *tokenizer().decode(ids);
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<TrivialFormat> format_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<HttpServer> server_;
};

const std::string kChat = R"("messages":[{"role":"user","content":"hi"}])";

TEST_F(ServerTest, ChatNonStreaming) {
  auto r = post("/v1/chat/completions", "{" + kChat + R"(,"max_tokens":5,"seed":3})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "kimi-k3");
  EXPECT_EQ(j["choices"][0]["message"]["content"], decoded(5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 5);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  auto p = engine_->submitted().at(0);
  EXPECT_EQ(p.max_new_tokens, 5);
  EXPECT_TRUE(p.has_seed);
  EXPECT_EQ(p.seed, 3u);
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{100257});
  EXPECT_EQ(p.top_logprobs, -1);
}

TEST_F(ServerTest, ChatStreamingWithUsage) {
  auto r = post("/v1/chat/completions",
                "{" + kChat + R"(,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.head.find("text/event-stream"), std::string::npos);
  bool done = false;
  auto ev = events(r.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text, finish;
  for (auto& e : ev) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e["choices"].empty()) continue;
    auto& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, kScript);
  EXPECT_EQ(finish, "stop");
  EXPECT_TRUE(ev.back()["choices"].empty());
  EXPECT_GT(ev.back()["usage"]["completion_tokens"].get<int>(), 5);
}

TEST_F(ServerTest, StopStringAcrossTokens) {
  // "o wor" spans the tokens "Hello" and " world".
  for (bool stream : {false, true}) {
    auto r = post("/v1/chat/completions", "{" + kChat + R"(,"stop":["o wor","zzz"],"stream":)" +
                                              (stream ? "true" : "false") + "}");
    ASSERT_EQ(r.status, 200);
    std::string text, finish;
    if (stream) {
      bool done;
      for (auto& e : events(r.body, &done)) {
        auto& c = e["choices"][0];
        if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      }
    } else {
      auto j = json::parse(r.body);
      text = j["choices"][0]["message"]["content"];
      finish = j["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, "Hell") << stream;
    EXPECT_EQ(finish, "stop");
  }
  EXPECT_EQ(engine_->cancels().size(), 2u);  // generation cut off at the stop string
}

TEST_F(ServerTest, MultipleChoicesWithSeeds) {
  auto r = post("/v1/chat/completions", "{" + kChat + R"(,"n":3,"seed":7,"max_tokens":4})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], decoded(4));
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  auto subs = engine_->submitted();
  ASSERT_EQ(subs.size(), 3u);
  EXPECT_EQ(subs[0].seed, 7u);
  EXPECT_EQ(subs[1].seed, 8u);
  EXPECT_EQ(subs[2].seed, 9u);
}

TEST_F(ServerTest, ChatLogprobs) {
  auto r = post("/v1/chat/completions", "{" + kChat + R"(,"logprobs":true,"top_logprobs":2,"max_tokens":3})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  auto& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 3u);
  EXPECT_EQ(lp[0]["token"], "Hello");
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(lp[0]["bytes"].size(), 5u);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(engine_->submitted().at(0).top_logprobs, 2);
}

TEST_F(ServerTest, CompletionsTokensEchoAndLogprobs) {
  auto ids = tokenizer().encode("Say:", chat::SpecialMode::kAsText);
  json body = {{"prompt", ids}, {"echo", true}, {"max_tokens", 2}, {"logprobs", 1}};
  auto r = post("/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Say:" + decoded(2));
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 1u);

  auto s = post("/v1/completions", R"({"prompt":"x","stream":true,"max_tokens":3})");
  bool done;
  std::string text;
  for (auto& e : events(s.body, &done)) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(text, decoded(3));
}

TEST_F(ServerTest, MaxTokensBeyondContextIs400) {
  auto r = post("/v1/chat/completions", "{" + kChat + R"(,"max_tokens":5000})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "context_length_exceeded");
  auto bad = post("/v1/completions", R"({"prompt":[999999999]})");
  EXPECT_EQ(bad.status, 400);
}

TEST_F(ServerTest, ApiKey) {
  start("sekrit");
  auto r = post("/v1/chat/completions", "{" + kChat + "}");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "authentication_error");
  EXPECT_EQ(post("/v1/chat/completions", "{" + kChat + "}", "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(post("/v1/chat/completions", "{" + kChat + R"(,"max_tokens":1})", "Authorization: Bearer sekrit\r\n").status,
            200);
  EXPECT_EQ(get("/metrics").status, 401);
  EXPECT_EQ(get("/v1/models").status, 401);
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/health/ready").status, 200);
}

TEST_F(ServerTest, ModelNotFound) {
  auto r = post("/v1/chat/completions", R"({"model":"gpt-4o",)" + kChat + "}");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "model_not_found");
}

TEST_F(ServerTest, BodyTooLargeIs413) {
  std::string big = "{" + kChat + ",\"pad\":\"" + std::string(100 * 1024, 'a') + "\"}";
  auto r = post("/v1/chat/completions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(ServerTest, QueueFullIs429) {
  engine_->set_reject(true);
  auto r = post("/v1/chat/completions", "{" + kChat + "}");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "queue_full");
  engine_->set_reject(false);
  EXPECT_EQ(post("/v1/chat/completions", "{" + kChat + R"(,"max_tokens":1})").status, 200);
}

TEST_F(ServerTest, NotReady) {
  engine_->ready_ = false;
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/health/ready").status, 503);
  EXPECT_EQ(get("/health?ready").status, 503);
  EXPECT_EQ(post("/v1/chat/completions", "{" + kChat + "}").status, 503);
}

// A service that can no longer serve (a cell that lost a rank) fails liveness too, with the reason.
TEST_F(ServerTest, FailedServiceFailsBothHealthChecks) {
  engine_->ready_ = false;
  engine_->set_failure("the cell failed: rank 1 is gone");
  for (const char* path : {"/health", "/health/ready", "/health?ready"}) {
    auto r = get(path);
    EXPECT_EQ(r.status, 503) << path;
    EXPECT_EQ(json::parse(r.body)["status"], "failed") << path;
    EXPECT_EQ(json::parse(r.body)["error"], "the cell failed: rank 1 is gone") << path;
  }
  engine_->set_failure("");
  engine_->ready_ = true;
  EXPECT_EQ(get("/health").status, 200);
}

// A cell with a silent rank (ApiConfig::liveness) fails both checks with the reason, and recovers with it.
TEST_F(ServerTest, UnhealthyCellFailsBothHealthChecks) {
  set_liveness("rank 1 sent no heartbeat for 1200 ms (frozen, overloaded or unreachable)");
  for (const char* path : {"/health", "/health/ready", "/health?ready"}) {
    auto r = get(path);
    EXPECT_EQ(r.status, 503) << path;
    EXPECT_EQ(json::parse(r.body)["status"], "unhealthy") << path;
    EXPECT_EQ(json::parse(r.body)["error"], "rank 1 sent no heartbeat for 1200 ms (frozen, overloaded or unreachable)")
        << path;
  }
  set_liveness("");
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/health/ready").status, 200);
}

TEST_F(ServerTest, DisconnectMidStreamCancels) {
  engine_->set_repeat(true);
  {
    RawClient c(server_->port());
    c.send(http_post("/v1/chat/completions", "{" + kChat + R"(,"stream":true,"max_tokens":4000})"));
    c.read_until([](const std::string& b) { return b.find("Hello") != std::string::npos; });
    ASSERT_TRUE(engine_->cancels().empty());
  }  // socket closed
  auto closed_at = std::chrono::steady_clock::now();
  for (int i = 0; i < 200 && engine_->cancels().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engine_->cancels().size(), 1u);
  EXPECT_LT(engine_->cancel_time() - closed_at, std::chrono::milliseconds(500));
  for (int i = 0; i < 200 && engine_->active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine_->active(), 0u);
}

TEST_F(ServerTest, DisconnectNonStreamingCancels) {
  engine_->set_repeat(true);
  {
    RawClient c(server_->port());
    c.send(http_post("/v1/chat/completions", "{" + kChat + R"(,"max_tokens":4000})"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int i = 0; i < 200 && engine_->cancels().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine_->cancels().size(), 1u);
}

TEST_F(ServerTest, KeepAliveAndPipelining) {
  RawClient c(server_->port());
  std::string one = http_post("/v1/chat/completions", "{" + kChat + R"(,"max_tokens":2})");
  c.send(one + one + "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(c.read_response().status, 200);
  EXPECT_EQ(c.read_response().status, 200);
  auto m = c.read_response();
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "kimi-k3");
}

TEST_F(ServerTest, TokenizeDetokenizeMetrics) {
  auto t = post("/tokenize", R"({"prompt":"hello world"})");
  ASSERT_EQ(t.status, 200);
  auto ids = json::parse(t.body)["tokens"];
  EXPECT_EQ(ids.size(), 2u);
  auto d = post("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(json::parse(d.body)["prompt"], "hello world");
  auto m = get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("kestrel_requests_running"), std::string::npos);
  EXPECT_NE(m.body.find("kestrel_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"), std::string::npos);
  EXPECT_NE(m.body.find("kestrel_step_sequences_bucket{le=\"2\"} 3\n"), std::string::npos);
  EXPECT_NE(m.body.find("kestrel_step_sequences_count 4\n"), std::string::npos);
  EXPECT_NE(m.body.find("kestrel_step_sequences_max 3\n"), std::string::npos);
  EXPECT_EQ(get("/nope").status, 404);
  EXPECT_EQ(get("/v1/chat/completions").status, 405);
}

TEST_F(ServerTest, GracefulStopLetsStreamFinish) {
  RawClient c(server_->port());
  c.send(http_post("/v1/chat/completions", "{" + kChat + R"(,"stream":true,"max_tokens":30})"));
  c.read_until([](const std::string& b) { return b.find("Hello") != std::string::npos; });
  server_->stop();
  auto all = c.read_until([](const std::string& b) { return b.find("[DONE]") != std::string::npos; });
  EXPECT_NE(all.find("[DONE]"), std::string::npos);
  EXPECT_EQ(server_->open_connections(), 0);
}

}  // namespace
}  // namespace kestrel::server
