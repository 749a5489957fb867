// CompletionJob: one /v1/chat/completions or /v1/completions request after validation — submits its n
// generation requests, turns token events into text (StreamDecoder → StopMatcher → OutputParser) and answers
// as one JSON body or as an SSE stream.
//
// Threading: engine events arrive on the scheduler thread and are posted to the exchange's strand; all job
// state is touched only there. A client disconnect cancels every submitted request at once. The job is kept
// alive by its pending engine callbacks and ends after the last final event.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "chat/tokenizer.h"
#include "scheduler/engine_service.h"
#include "server/chat_format.h"
#include "server/http_server.h"

namespace kestrel::server {

struct JobSpec {
  bool chat = true;           // chat.completion vs text_completion shapes
  std::string id;             // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;        // unix seconds
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  std::vector<std::string> stop;
  std::string echo;           // completions with echo: the prompt text, emitted first
  ReasoningOptions reasoning;  // chat: for the output parser
  // ignore_eos: the end of the assistant message (parsed from the text) does not end the generation either;
  // the text after it streams as plain content until max_tokens or another limit.
  bool ignore_eos = false;
  int prompt_tokens = 0;
  int image_tokens = 0;  // of which image positions (usage.prompt_tokens_details.image_tokens when > 0)
};

// Starts the job; answers through `ex` (errors from submit included). `base.params.seed` is offset by the
// choice index when has_seed. `format` may be null for text completions (plain content).
void run_completion_job(std::shared_ptr<HttpExchange> ex, EngineService& engine, const chat::Tokenizer& tok,
                        const ChatFormat* format, JobSpec spec, GenerationRequest base);

// Maps an EngineService::submit error to the HTTP error (429 queue full, 400 too long / invalid, 500 else).
HttpResponse submit_error_response(const Status& st);

}  // namespace kestrel::server
