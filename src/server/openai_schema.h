// OpenAI request parsing and validation: JSON bytes → typed structs, or an OpenAI-style error.
//
// Contract: never throws, never aborts, for any input bytes. Unknown fields are ignored. Every numeric field
// has an explicit range and every list a maximum length (SchemaLimits). All strings are valid UTF-8 (the
// JSON parser rejects invalid bytes and lone surrogates; extracted strings are checked again). Stateless and
// thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>
#include <string>
#include <string_view>
#include <vector>

#include "server/chat_format.h"

namespace kestrel::server {

// An error as the OpenAI API shows it: {"error":{"message","type","param","code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty → null
  std::string code;   // empty → null
  nlohmann::json to_json() const;
  std::string body() const;  // to_json().dump()
};

ApiError bad_request(std::string message, std::string param = {}, std::string code = {});

struct SchemaLimits {
  std::string served_model;        // the one model id this server answers to
  int max_n = 8;
  int max_stop = 16;               // stop strings per request
  size_t max_stop_bytes = 256;     // bytes per stop string
  int max_top_logprobs = 20;
  size_t max_messages = 4096;
  size_t max_parts = 512;          // content parts per message
  size_t max_tools = 128;
  size_t max_stop_token_ids = 64;
  size_t max_prompt_token_ids = 1 << 20;
  int max_json_depth = 64;
};

// Sampling and output options shared by chat and text completions.
struct SamplingOptions {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0 (or -1 on input) → off
  float min_p = 0.0f;
  std::optional<int64_t> seed;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<int> max_tokens;  // max_completion_tokens wins over max_tokens
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  int n = 1;
  bool logprobs = false;
  int top_logprobs = 0;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  std::string cache_salt;  // prefix-cache namespace (vLLM's `cache_salt`): only equal salts share cached prefixes
  // PD router pairing (sglang-router): the prefill's bootstrap host / port and the request's room.
  std::string bootstrap_host;
  int bootstrap_port = 0;
  int64_t bootstrap_room = -1;  // -1: absent
};

struct ChatCompletionRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  std::vector<ToolDef> tools;
  ToolChoice tool_choice;
  ReasoningOptions reasoning;
  bool add_generation_prompt = true;
  SamplingOptions sampling;
};

struct CompletionRequest {
  std::string model;
  bool prompt_is_tokens = false;
  std::string prompt;                // !prompt_is_tokens
  std::vector<int32_t> prompt_ids;   // prompt_is_tokens
  bool echo = false;
  SamplingOptions sampling;          // logprobs: the integer `logprobs` field sets logprobs + top_logprobs
};

struct TokenizeRequest {
  std::string model;
  bool has_messages = false;
  std::string prompt;                 // !has_messages
  std::vector<ChatMessage> messages;  // has_messages (rendered with the chat format)
  bool add_generation_prompt = true;
  bool add_special_tokens = true;     // prompt: special-token strings become control tokens
};

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

// Parses bytes into a JSON object (depth-limited). Errors are 400 invalid_request_error.
std::variant<nlohmann::json, ApiError> parse_json_object(std::string_view body, int max_depth);

std::variant<ChatCompletionRequest, ApiError> parse_chat_request(std::string_view body, const SchemaLimits& lim);
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, const SchemaLimits& lim);
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body, const SchemaLimits& lim);
std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body, const SchemaLimits& lim);

}  // namespace kestrel::server
