// The OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize,
// /health, /health/ready (or /health?ready), /metrics, /reset_prefix_cache (admin: drops the prefix cache), and
// the chat page at / (server/web_assets.h).
//
// Every route except /health* and the chat page's files requires `Authorization: Bearer <api_key>` when api_key
// is set (401 otherwise; constant-time compare). Handlers validate, render / tokenize on the calling I/O thread and
// hand generation to a CompletionJob; a chat request's images are first encoded on the ImageQueue, and the request
// goes on from the exchange's strand when they are ready. ApiServer holds references: the engine, tokenizer and format must outlive
// it, and it must outlive the HttpServer using its router. Thread-safe (immutable after construction).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "chat/tokenizer.h"
#include "scheduler/engine_service.h"
#include "server/chat_format.h"
#include "server/http_server.h"
#include "server/image_queue.h"
#include "server/openai_schema.h"

namespace kestrel::server {

struct ApiConfig {
  std::string model_id = "kimi-k3";
  std::string api_key;  // empty → no authentication
  std::string model_root;       // where the model was loaded from: /v1/models "root" (empty → omitted)
  bool random_weights = false;  // a generated model: /v1/models says "random_weights": true
  const char* role = "both";    // PD role (both, prefill, decode): /v1/models says "role"
  std::chrono::milliseconds request_timeout{600'000};  // per generation request (GenerationRequest::deadline)
  SchemaLimits limits;  // served_model is set from model_id
  // Chat requests with image_url parts are encoded on it (never on the I/O thread); null: such requests are
  // refused (400). Must outlive the server.
  ImageQueue* images = nullptr;
  // Why this server must be drained although its service still runs (a cell rank that stopped sending
  // heartbeats, dist/liveness.h); empty while healthy. Null: not asked. Must be thread-safe.
  std::function<std::string()> liveness;
};

class ApiServer {
 public:
  ApiServer(ApiConfig config, EngineService& engine, const chat::Tokenizer& tokenizer, const ChatFormat& format);
  // A router with every route and the auth filter; handlers refer to *this.
  std::shared_ptr<Router> make_router() const;

 private:
  void chat_completions(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  // The chat request after its images (if any) are ready: render and generate.
  void chat_with_images(const std::shared_ptr<HttpExchange>& ex, const ChatCompletionRequest& r,
                        const ImageBatch* images) const;
  void completions(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  void models(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  void health(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex, bool ready_check) const;
  void metrics(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  // SGLang's load report, polled by sglang-router's load-aware policies (power_of_two, cache_aware).
  void load(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  void tokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  void detokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  bool authorized(const HttpRequest& req) const;
  // Shared tail of both completion routes: limits, params, submit.
  // `images`: the chat request's images (prompt already holds their placeholders), or null.
  void generate(const std::shared_ptr<HttpExchange>& ex, bool chat, std::vector<int32_t> prompt,
                const SamplingOptions& s, const ReasoningOptions& reasoning, std::string echo,
                const std::string& model, const ImageBatch* images = nullptr) const;

  ApiConfig config_;
  EngineService& engine_;
  const chat::Tokenizer& tok_;
  const ChatFormat& format_;
  int64_t created_;
};

}  // namespace kestrel::server
