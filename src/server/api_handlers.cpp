#include "server/api_handlers.h"

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "chat/stream_decoder.h"
#include "server/completion_job.h"
#include "server/metrics_text.h"
#include "server/web_assets.h"

namespace kestrel::server {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(const std::shared_ptr<HttpExchange>& ex, int status, const json& j) {
  ex->respond(HttpResponse{status, "application/json", dump(j), {}});
}
void send_error(const std::shared_ptr<HttpExchange>& ex, const ApiError& e) {
  ex->respond(HttpResponse{e.status, "application/json", e.body(), {}});
}

// Process-unique, non-guessable-enough completion ids ("chatcmpl-<hex>").
std::string make_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[48];
  snprintf(buf, sizeof buf, "%s-%016llx%04llx", prefix, static_cast<unsigned long long>(salt),
           static_cast<unsigned long long>(counter.fetch_add(1) & 0xffff));
  return buf;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

template <typename T>
bool unwrap(std::variant<T, ApiError>& v, const std::shared_ptr<HttpExchange>& ex) {
  if (auto* e = std::get_if<ApiError>(&v)) {
    send_error(ex, *e);
    return false;
  }
  return true;
}

bool valid_ids(const chat::Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (!tok.token_bytes(id)) return false;
  return true;
}

// The chat page's files are public (the page asks for the key itself); everything else needs the key.
bool is_web_asset(const HttpRequest& req) {
  if (req.method != "GET") return false;
  for (const WebAsset& a : web_assets())
    if (req.path == a.path) return true;
  return false;
}

}  // namespace

ApiServer::ApiServer(ApiConfig config, EngineService& engine, const chat::Tokenizer& tokenizer,
                     const ChatFormat& format)
    : config_(std::move(config)), engine_(engine), tok_(tokenizer), format_(format) {
  config_.limits.served_model = config_.model_id;
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count();
}

std::shared_ptr<Router> ApiServer::make_router() const {
  auto r = std::make_shared<Router>();
  r->set_filter([this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    if (req.path != "/health" && req.path != "/health/ready" && !is_web_asset(req) && !authorized(req)) {
      ApiError e{401, "Invalid or missing API key (Authorization: Bearer ...)", "authentication_error", {},
                 "invalid_api_key"};
      HttpResponse resp{401, "application/json", e.body(), {{"WWW-Authenticate", "Bearer"}}};
      ex->respond(std::move(resp));
      return true;
    }
    // Bodies are JSON: another declared media type is refused (an absent Content-Type is accepted).
    std::string ct(req.header("content-type").substr(0, 16));
    for (auto& c : ct) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (req.method == "POST" && !ct.empty() && ct != "application/json") {
      send_error(ex, ApiError{415, "Content-Type must be application/json", "invalid_request_error", {},
                              "unsupported_media_type"});
      return true;
    }
    return false;
  });
  r->add("POST", "/v1/chat/completions", [this](auto& q, auto ex) { chat_completions(q, ex); });
  r->add("POST", "/v1/completions", [this](auto& q, auto ex) { completions(q, ex); });
  r->add("GET", "/v1/models", [this](auto& q, auto ex) { models(q, ex); });
  r->add("GET", "/health", [this](auto& q, auto ex) { health(q, ex, q.query == "ready"); });
  r->add("GET", "/health/ready", [this](auto& q, auto ex) { health(q, ex, true); });
  r->add("GET", "/metrics", [this](auto& q, auto ex) { metrics(q, ex); });
  r->add("GET", "/get_load", [this](auto& q, auto ex) { load(q, ex); });
  // Admin: drop every cached prefix (the name vLLM's server uses). Needs the API key like every other route.
  r->add("POST", "/reset_prefix_cache", [this](auto&, auto ex) {
    engine_.flush_prefix_cache();
    ex->respond(HttpResponse{200, "application/json", R"({"status":"ok"})", {}});
  });
  r->add("POST", "/tokenize", [this](auto& q, auto ex) { tokenize(q, ex); });
  r->add("POST", "/detokenize", [this](auto& q, auto ex) { detokenize(q, ex); });
  for (const WebAsset& a : web_assets()) {
    r->add("GET", std::string(a.path), [a](const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
      ex->respond(HttpResponse{200, std::string(a.content_type), std::string(a.body),
                               {{"Content-Security-Policy", std::string(kWebCsp)},
                                {"X-Content-Type-Options", "nosniff"},
                                {"Referrer-Policy", "no-referrer"},
                                {"Cache-Control", "no-cache"}}});
    });
  }
  return r;
}

bool ApiServer::authorized(const HttpRequest& req) const {
  if (config_.api_key.empty()) return true;
  std::string_view h = req.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (h.size() < kBearer.size() || h.substr(0, kBearer.size()) != kBearer) return false;
  return constant_time_equal(h.substr(kBearer.size()), config_.api_key);
}

void ApiServer::chat_completions(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const {
  auto parsed = parse_chat_request(req.body, config_.limits);
  if (!unwrap(parsed, ex)) return;
  auto& r = std::get<ChatCompletionRequest>(parsed);
  std::vector<std::string> urls;
  for (const auto& m : r.messages)
    for (const auto& p : m.content_parts)
      if (p.kind == ContentPart::Kind::kImageUrl) urls.push_back(p.url);
  if (urls.empty()) return chat_with_images(ex, r, nullptr);
  if (config_.images == nullptr)
    return send_error(ex, bad_request("This model does not take images (no vision tower)", "messages"));
  auto chat = std::make_shared<ChatCompletionRequest>(std::move(r));
  std::weak_ptr<HttpExchange> weak = ex;
  Status queued = config_.images->submit(
      std::move(urls), std::chrono::steady_clock::now() + config_.request_timeout,
      [weak] {
        auto e = weak.lock();
        return e == nullptr || e->disconnected();
      },
      [this, ex, chat](Result<ImageBatch> batch) {
        ex->post([this, ex, chat, batch = std::move(batch)]() mutable {
          if (batch) return chat_with_images(ex, *chat, &*batch);
          if (batch.error().code() == StatusCode::kUnavailable)
            return send_error(ex, ApiError{503, "Images not ready: " + batch.error().message(), "server_error", {},
                                           "timeout"});
          send_error(ex, bad_request("Invalid image: " + batch.error().message(), "messages"));
        });
      });
  if (!queued.is_ok())
    send_error(ex, ApiError{429, "The server is busy (image queue full), retry later: " + queued.message(),
                            "rate_limit_error", {}, "queue_full"});
}

void ApiServer::chat_with_images(const std::shared_ptr<HttpExchange>& ex, const ChatCompletionRequest& r,
                                 const ImageBatch* images) const {
  RenderInput in;
  in.messages = &r.messages;
  in.tools = &r.tools;
  in.tool_choice = r.tool_choice;
  in.reasoning = r.reasoning;
  in.add_generation_prompt = r.add_generation_prompt;
  if (images != nullptr) in.image_prompts = &images->prompts;
  auto prompt = format_.render(in);
  if (!prompt) return send_error(ex, bad_request("Cannot render the messages: " + prompt.error().message(), "messages"));
  generate(ex, /*chat=*/true, std::move(*prompt), r.sampling, r.reasoning, {}, r.model, images);
}

void ApiServer::completions(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const {
  auto parsed = parse_completion_request(req.body, config_.limits);
  if (!unwrap(parsed, ex)) return;
  auto& r = std::get<CompletionRequest>(parsed);
  std::vector<int32_t> prompt = r.prompt_is_tokens ? r.prompt_ids : tok_.encode(r.prompt, chat::SpecialMode::kAllow);
  if (r.prompt_is_tokens && !valid_ids(tok_, prompt))
    return send_error(ex, bad_request("'prompt' contains a token id outside the vocabulary", "prompt"));
  std::string echo;
  if (r.echo) {
    if (r.prompt_is_tokens) {
      auto text = tok_.decode(prompt);
      chat::StreamDecoder d(tok_);
      echo = text ? d.push_bytes(*text) + d.flush() : std::string();
    } else {
      echo = r.prompt;
    }
  }
  generate(ex, /*chat=*/false, std::move(prompt), r.sampling, {}, std::move(echo), r.model);
}

void ApiServer::generate(const std::shared_ptr<HttpExchange>& ex, bool chat, std::vector<int32_t> prompt,
                         const SamplingOptions& s, const ReasoningOptions& reasoning, std::string echo,
                         const std::string& model, const ImageBatch* images) const {
  if (!engine_.ready())
    return send_error(ex, ApiError{503, "The model is not ready yet", "server_error", {}, "not_ready"});
  const int ctx = engine_.max_context();
  const int plen = static_cast<int>(prompt.size());
  if (plen == 0) return send_error(ex, bad_request("The prompt is empty", "prompt"));
  if (!valid_ids(tok_, s.stop_token_ids))
    return send_error(ex, bad_request("'stop_token_ids' contains a token id outside the vocabulary", "stop_token_ids"));
  if (plen >= ctx)
    return send_error(ex, bad_request("The prompt has " + std::to_string(plen) + " tokens; the context limit is " +
                                          std::to_string(ctx), "messages", "context_length_exceeded"));
  if (s.max_tokens && (*s.max_tokens > ctx || plen + *s.max_tokens > ctx))
    return send_error(ex, bad_request("'max_tokens' (" + std::to_string(*s.max_tokens) + ") plus the prompt (" +
                                          std::to_string(plen) + " tokens) exceeds the context limit " +
                                          std::to_string(ctx), "max_tokens", "context_length_exceeded"));
  GenerationRequest g;
  if (images != nullptr) {
    // Each image's placeholder is one run of <|media_pad|>; its hash keys the prefix cache at the run's start.
    const auto pad = tok_.special_id("<|media_pad|>");
    int64_t pads = 0;
    for (size_t i = 0; pad && i < prompt.size(); ++i) {
      if (prompt[i] != *pad) continue;
      if ((i == 0 || prompt[i - 1] != *pad) && g.image_keys.size() < images->hashes.size())
        g.image_keys.push_back({static_cast<int64_t>(i), images->hashes[g.image_keys.size()]});
      ++pads;
    }
    if (pads != images->tokens || g.image_keys.size() != images->hashes.size())
      return send_error(ex, bad_request("The rendered prompt does not hold the images' placeholders", "messages"));
    g.media = images->embeddings;
  }
  g.prompt = std::move(prompt);
  g.cache_salt = s.cache_salt;
  if (s.bootstrap_room >= 0)
    g.bootstrap = {true, s.bootstrap_host, s.bootstrap_port, static_cast<uint64_t>(s.bootstrap_room)};
  auto& p = g.params;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.min_p = s.min_p;
  p.has_seed = s.seed.has_value();
  p.seed = s.seed ? static_cast<uint64_t>(*s.seed) : 0;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.repetition_penalty = s.repetition_penalty;
  p.max_new_tokens = s.max_tokens ? *s.max_tokens : ctx - plen;
  p.stop_token_ids = s.stop_token_ids;
  if (!s.ignore_eos)
    for (int32_t id : format_.stop_token_ids()) p.stop_token_ids.push_back(id);
  p.top_logprobs = s.logprobs ? s.top_logprobs : -1;
  g.deadline = std::chrono::steady_clock::now() + config_.request_timeout;

  JobSpec spec;
  spec.chat = chat;
  spec.id = make_id(chat ? "chatcmpl" : "cmpl");
  spec.model = model.empty() ? config_.model_id : model;
  spec.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch()).count();
  spec.n = s.n;
  spec.stream = s.stream;
  spec.include_usage = s.include_usage;
  spec.logprobs = s.logprobs;
  spec.stop = s.stop;
  spec.echo = std::move(echo);
  spec.reasoning = reasoning;
  spec.ignore_eos = s.ignore_eos;
  spec.prompt_tokens = plen;
  spec.image_tokens = images != nullptr ? static_cast<int>(images->tokens) : 0;
  run_completion_job(ex, engine_, tok_, chat ? &format_ : nullptr, std::move(spec), std::move(g));
}

void ApiServer::models(const HttpRequest&, const std::shared_ptr<HttpExchange>& ex) const {
  json m = {{"id", config_.model_id}, {"object", "model"}, {"created", created_}, {"owned_by", "kestrel"},
            {"max_model_len", engine_.max_context()}};
  if (!config_.model_root.empty()) m["root"] = config_.model_root;
  if (config_.random_weights) m["random_weights"] = true;
  m["role"] = config_.role;
  send_json(ex, 200, json{{"object", "list"}, {"data", json::array({m})}});
}

void ApiServer::health(const HttpRequest&, const std::shared_ptr<HttpExchange>& ex, bool ready_check) const {
  // A service that can no longer serve (a cell that lost a rank) fails both checks, so a router drains it.
  if (const std::string why = engine_.failure(); !why.empty())
    return send_json(ex, 503, json{{"status", "failed"}, {"error", why}});
  // A cell with a silent rank is not failed yet (the rank may come back), but cannot be trusted to answer.
  if (config_.liveness)
    if (const std::string why = config_.liveness(); !why.empty())
      return send_json(ex, 503, json{{"status", "unhealthy"}, {"error", why}});
  if (!ready_check) return send_json(ex, 200, json{{"status", "ok"}});
  bool ready = engine_.ready();
  send_json(ex, ready ? 200 : 503, json{{"status", ready ? "ready" : "not_ready"}});
}

void ApiServer::metrics(const HttpRequest&, const std::shared_ptr<HttpExchange>& ex) const {
  std::string text = prometheus_text(engine_.stats(), engine_.ready()) + engine_.extra_metrics();
  if (config_.images != nullptr)
    text += prometheus_image_text(config_.images->service().metrics(), config_.images->metrics());
  ex->respond(HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", std::move(text), {}});
}

// SGLang's shape (one entry per data-parallel rank; a Kestrel server is one): num_tokens = the tokens its cache
// holds for running sequences (pages in use × page size) plus the tokens its waiting requests must feed, as
// SGLang's scheduler counts it; sglang-router's load monitor reads num_tokens.
void ApiServer::load(const HttpRequest&, const std::shared_ptr<HttpExchange>& ex) const {
  const ServiceStats s = engine_.stats();
  const double tic = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  send_json(ex, 200, json::array({json{{"dp_rank", 0},
                                       {"num_reqs", s.running + s.waiting},
                                       {"num_waiting_reqs", s.waiting},
                                       {"num_tokens", s.kv_blocks_used * s.page_tokens + s.waiting_prompt_tokens},
                                       {"num_pending_tokens", s.waiting_prompt_tokens},
                                       {"ts_tic", tic}}}));
}

void ApiServer::tokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const {
  auto parsed = parse_tokenize_request(req.body, config_.limits);
  if (!unwrap(parsed, ex)) return;
  auto& r = std::get<TokenizeRequest>(parsed);
  std::vector<int32_t> ids;
  if (r.has_messages) {
    RenderInput in;
    in.messages = &r.messages;
    std::vector<ToolDef> none;
    in.tools = &none;
    in.add_generation_prompt = r.add_generation_prompt;
    auto rendered = format_.render(in);
    if (!rendered) return send_error(ex, bad_request("Cannot render the messages: " + rendered.error().message()));
    ids = std::move(*rendered);
  } else {
    ids = tok_.encode(r.prompt, r.add_special_tokens ? chat::SpecialMode::kAllow : chat::SpecialMode::kAsText);
  }
  send_json(ex, 200, json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine_.max_context()}});
}

void ApiServer::detokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const {
  auto parsed = parse_detokenize_request(req.body, config_.limits);
  if (!unwrap(parsed, ex)) return;
  auto& r = std::get<DetokenizeRequest>(parsed);
  auto bytes = tok_.decode(r.tokens);
  if (!bytes) return send_error(ex, bad_request("'tokens': " + bytes.error().message(), "tokens"));
  chat::StreamDecoder d(tok_);
  std::string text = d.push_bytes(*bytes) + d.flush();
  send_json(ex, 200, json{{"prompt", text}});
}

}  // namespace kestrel::server
