#include "server/completion_job.h"

#include <map>
#include <nlohmann/json.hpp>

#include "chat/stream_decoder.h"
#include "chat/utf8.h"
#include "server/openai_schema.h"
#include "server/stop_matcher.h"

namespace kestrel::server {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Passes text through unchanged (text completions, or no chat format).
class PlainParser : public OutputParser {
 public:
  ParsedDelta push(std::string_view text) override { return ParsedDelta{{}, std::string(text), {}, false}; }
  ParsedDelta finish() override { return {}; }
};

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";
    case FinishReason::kTimeout: return "timeout";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "stop";
}

struct ToolAccum {
  std::string id, name, arguments;
};

struct Choice {
  explicit Choice(const chat::Tokenizer& tok, std::vector<std::string> stop) : dec(tok), stopper(std::move(stop)) {}
  uint64_t req_id = 0;
  bool submitted = false, finished = false, stopped_by_us = false;
  bool past_end = false;  // ignore_eos: the parser saw the end of the message; later text is plain content
  chat::StreamDecoder dec;
  StopMatcher stopper;
  std::unique_ptr<OutputParser> parser;
  std::string content, reasoning;  // accumulated (non-streaming)
  std::vector<ToolAccum> tools;
  json logprobs = json::array();   // chat: entries; completions: built at the end / per chunk
  std::string finish;
  std::string error;
  int completion_tokens = 0;
  size_t text_offset = 0;          // completions logprobs text_offset
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(std::shared_ptr<HttpExchange> ex, EngineService& engine, const chat::Tokenizer& tok, const ChatFormat* fmt,
      JobSpec spec)
      : ex_(std::move(ex)), engine_(engine), tok_(tok), fmt_(fmt), spec_(std::move(spec)) {}

  void start(GenerationRequest base) {
    for (int i = 0; i < spec_.n; ++i) {
      choices_.push_back(std::make_unique<Choice>(tok_, spec_.stop));
      choices_.back()->parser = fmt_ && spec_.chat ? fmt_->make_output_parser(spec_.reasoning)
                                                   : std::make_unique<PlainParser>();
    }
    std::weak_ptr<Job> weak = weak_from_this();
    for (int i = 0; i < spec_.n; ++i) {
      GenerationRequest r = base;
      if (r.params.has_seed) r.params.seed += static_cast<uint64_t>(i);
      r.on_event = [self = shared_from_this(), i](const GenerationEvent& ev) {
        self->ex_->post([self, i, ev] { self->on_event(i, ev); });
      };
      auto id = engine_.submit(std::move(r));
      if (!id) {
        failed_ = true;
        cancel_all();
        return ex_->respond(submit_error_response(id.error()));
      }
      choices_[i]->req_id = *id;
      choices_[i]->submitted = true;
    }
    remaining_ = spec_.n;
    ex_->on_disconnect([weak] {
      if (auto self = weak.lock()) self->cancel_all();
    });
    if (!spec_.stream) return;
    ex_->start_stream(200, "text/event-stream");
    for (int i = 0; i < spec_.n; ++i) {
      if (spec_.chat) {
        send_chunk(i, json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
      }
      if (!spec_.echo.empty()) emit(i, ParsedDelta{{}, spec_.echo, {}, false}, json());
    }
  }

 private:
  void cancel_all() {
    for (auto& c : choices_)
      if (c->submitted && !c->finished) engine_.cancel(c->req_id);
  }

  json token_entry(int32_t id, float lp) const {
    auto b = tok_.token_bytes(id);
    std::string bytes = b ? std::string(*b) : std::string();
    json arr = json::array();
    for (unsigned char ch : bytes) arr.push_back(static_cast<int>(ch));
    return json{{"token", chat::utf8_replace_invalid(bytes)}, {"logprob", lp}, {"bytes", std::move(arr)}};
  }

  ParsedDelta parse(Choice& c, std::string text) {
    if (!c.past_end) return c.parser->push(text);
    ParsedDelta d;
    d.content = std::move(text);
    return d;
  }

  void on_event(int i, const GenerationEvent& ev) {
    Choice& c = *choices_[i];
    if (failed_ || c.finished) return;
    if (ev.finish != FinishReason::kNone) return on_final(i, ev);
    if (c.stopped_by_us || ev.token < 0) return;
    ++c.completion_tokens;
    json lp;
    if (spec_.logprobs) {
      lp = token_entry(ev.token, ev.logprob);
      json top = json::array();
      for (const auto& t : ev.top) top.push_back(token_entry(t.id, t.logprob));
      lp["top_logprobs"] = std::move(top);
    }
    auto text = c.dec.push(ev.token);
    std::string piece = c.stopper.push(text ? *text : std::string());
    ParsedDelta d = parse(c, std::move(piece));
    bool done = d.done;
    if (done && spec_.ignore_eos) c.past_end = true, done = false;
    emit(i, std::move(d), std::move(lp));
    // A token whose text is not out yet (held by the stop matcher, part of a UTF-8 sequence, or a token that decodes
    // to nothing) still shows in the stream when logprobs are asked for: its entry goes out now, with empty text.
    if (spec_.stream) flush_logprobs(i);
    if (c.stopper.stopped() || done) {
      c.stopped_by_us = true;
      engine_.cancel(c.req_id);
    }
  }

  void on_final(int i, const GenerationEvent& ev) {
    Choice& c = *choices_[i];
    if (!c.stopped_by_us) {
      std::string tail = c.stopper.push(c.dec.flush());
      tail += c.stopper.flush();
      emit(i, parse(c, std::move(tail)), json());
    }
    emit(i, c.parser->finish(), json());
    flush_logprobs(i);  // entries of tokens whose text never came out are still returned, one per token
    c.finished = true;
    prompt_tokens_ = std::max(prompt_tokens_, ev.prompt_tokens);
    cached_tokens_ = std::max(cached_tokens_, ev.cached_tokens);
    completion_tokens_ += c.completion_tokens;
    c.finish = c.stopped_by_us ? "stop" : finish_name(ev.finish);
    if (ev.finish == FinishReason::kError) c.error = ev.error.empty() ? "generation failed" : ev.error;
    if (!c.tools.empty() && c.finish == "stop") c.finish = "tool_calls";
    if (spec_.stream) {
      if (!c.error.empty()) {
        ex_->write(sse_event(dump(ApiError{500, c.error, "server_error", {}, {}}.to_json())));
      }
      send_chunk(i, spec_.chat ? json::object() : json(), nullptr, c.finish);
    }
    if (--remaining_ == 0) complete();
  }

  // Routes one parsed delta (+ the logprobs of the token that produced it) to the stream or the accumulators.
  void emit(int i, ParsedDelta d, json lp) {
    Choice& c = *choices_[i];
    if (!lp.is_null()) pending_lp_[i].push_back(std::move(lp));
    for (const auto& t : d.tool_calls) {
      if (t.index < 0 || t.index > 1024) continue;
      if (c.tools.size() <= static_cast<size_t>(t.index)) c.tools.resize(t.index + 1);
      auto& acc = c.tools[t.index];
      if (!t.id.empty()) acc.id = t.id;
      if (!t.name.empty()) acc.name = t.name;
      acc.arguments += t.arguments;
    }
    if (d.empty()) return;
    json logprobs = take_logprobs(i, d.content.size() + d.reasoning_content.size());
    if (!spec_.stream) {
      c.content += d.content;
      c.reasoning += d.reasoning_content;
      if (!logprobs.is_null()) append_logprobs(c, logprobs);
      return;
    }
    if (!spec_.chat) return send_chunk(i, json(d.content), std::move(logprobs), nullptr);
    json delta = json::object();
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& t : d.tool_calls) {
        json call = {{"index", t.index}};
        if (!t.id.empty()) call["id"] = t.id, call["type"] = "function";
        json fn = json::object();
        if (!t.name.empty()) fn["name"] = t.name;
        fn["arguments"] = t.arguments;
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    send_chunk(i, std::move(delta), std::move(logprobs), nullptr);
  }

  // Sends (stream) or keeps (non-stream) the logprob entries not yet attached to emitted text, with no text.
  void flush_logprobs(int i) {
    json lp = take_logprobs(i, 0);
    if (lp.is_null()) return;
    if (!spec_.stream) return append_logprobs(*choices_[i], lp);
    send_chunk(i, spec_.chat ? json::object() : json(""), std::move(lp), nullptr);
  }

  // Logprob entries not yet attached to emitted text, in the endpoint's shape (null if none / not requested).
  json take_logprobs(int i, size_t text_len) {
    auto it = pending_lp_.find(i);
    if (!spec_.logprobs || it == pending_lp_.end() || it->second.empty()) return json();
    json entries = std::move(it->second);
    pending_lp_.erase(it);
    if (spec_.chat) return json{{"content", std::move(entries)}};
    Choice& c = *choices_[i];
    json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (auto& e : entries) {
      out["tokens"].push_back(e["token"]);
      out["token_logprobs"].push_back(e["logprob"]);
      json top = json::object();
      for (auto& t : e["top_logprobs"]) top[t["token"].get<std::string>()] = t["logprob"];
      out["top_logprobs"].push_back(std::move(top));
      out["text_offset"].push_back(c.text_offset);
    }
    c.text_offset += text_len;
    return out;
  }

  void append_logprobs(Choice& c, const json& lp) {
    if (spec_.chat) {
      for (const auto& e : lp["content"]) c.logprobs.push_back(e);
      return;
    }
    if (c.logprobs.is_array()) c.logprobs = lp;
    else for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const auto& e : lp[k]) c.logprobs[k].push_back(e);
  }

  json usage() const {
    json u = {{"prompt_tokens", prompt_tokens_}, {"completion_tokens", completion_tokens_},
              {"total_tokens", prompt_tokens_ + completion_tokens_},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
    if (spec_.image_tokens > 0) u["prompt_tokens_details"]["image_tokens"] = spec_.image_tokens;
    return u;
  }

  json envelope() const {
    json j = {{"id", spec_.id}, {"object", spec_.chat ? (spec_.stream ? "chat.completion.chunk" : "chat.completion")
                                                      : "text_completion"},
              {"created", spec_.created}, {"model", spec_.model}};
    return j;
  }

  // Chat: `payload` is the delta object. Completions: the text string (null on the final chunk).
  void send_chunk(int i, json payload, json logprobs, json finish) {
    json ch = {{"index", i}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
    if (spec_.chat) ch["delta"] = std::move(payload);
    else ch["text"] = payload.is_null() ? json("") : std::move(payload);
    json j = envelope();
    j["choices"] = json::array({std::move(ch)});
    if (spec_.include_usage) j["usage"] = nullptr;
    ex_->write(sse_event(dump(j)));
  }

  void complete() {
    // Flush prompt_tokens from the spec if the engine did not report them.
    if (prompt_tokens_ == 0) prompt_tokens_ = spec_.prompt_tokens;
    if (spec_.stream) {
      if (spec_.include_usage) {
        json j = envelope();
        j["choices"] = json::array();
        j["usage"] = usage();
        ex_->write(sse_event(dump(j)));
      }
      ex_->write(sse_event("[DONE]"));
      return ex_->end_stream();
    }
    bool all_failed = true;
    for (auto& c : choices_) all_failed = all_failed && !c->error.empty();
    if (all_failed)
      return ex_->respond(HttpResponse{500, "application/json",
                                       ApiError{500, choices_[0]->error, "server_error", {}, {}}.body(), {}});
    json j = envelope();
    json arr = json::array();
    for (int i = 0; i < spec_.n; ++i) {
      Choice& c = *choices_[i];
      json lp = spec_.logprobs ? (spec_.chat ? json{{"content", c.logprobs}} : c.logprobs) : json();
      if (!spec_.chat) {
        arr.push_back({{"index", i}, {"text", spec_.echo + c.content}, {"logprobs", lp}, {"finish_reason", c.finish}});
        continue;
      }
      json msg = {{"role", "assistant"}, {"content", c.content}};
      if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
      if (!c.tools.empty()) {
        json calls = json::array();
        for (const auto& t : c.tools)
          calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        msg["tool_calls"] = std::move(calls);
        if (c.content.empty()) msg["content"] = nullptr;
      }
      arr.push_back({{"index", i}, {"message", std::move(msg)}, {"logprobs", lp}, {"finish_reason", c.finish}});
    }
    j["choices"] = std::move(arr);
    j["usage"] = usage();
    ex_->respond(HttpResponse{200, "application/json", dump(j), {}});
  }

  std::shared_ptr<HttpExchange> ex_;
  EngineService& engine_;
  const chat::Tokenizer& tok_;
  const ChatFormat* fmt_;
  JobSpec spec_;
  std::vector<std::unique_ptr<Choice>> choices_;
  std::map<int, json> pending_lp_;
  int remaining_ = 0;
  bool failed_ = false;
  int prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
};

}  // namespace

HttpResponse submit_error_response(const Status& st) {
  ApiError e;
  switch (st.code()) {
    case StatusCode::kUnavailable:
      e = {429, "The server is busy (queue full), retry later: " + st.message(), "rate_limit_error", {}, "queue_full"};
      break;
    case StatusCode::kTooLarge:
      e = {400, st.message(), "invalid_request_error", {}, "context_length_exceeded"};
      break;
    case StatusCode::kInvalidArgument:
      e = {400, st.message(), "invalid_request_error", {}, {}};
      break;
    default:
      e = {500, st.message(), "server_error", {}, {}};
  }
  HttpResponse r{e.status, "application/json", e.body(), {}};
  if (e.status == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

void run_completion_job(std::shared_ptr<HttpExchange> ex, EngineService& engine, const chat::Tokenizer& tok,
                        const ChatFormat* format, JobSpec spec, GenerationRequest base) {
  auto job = std::make_shared<Job>(std::move(ex), engine, tok, format, std::move(spec));
  job->start(std::move(base));
}

}  // namespace kestrel::server
