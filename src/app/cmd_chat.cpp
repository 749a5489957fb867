// `kestrel chat`: interactive multi-turn chat on one model, streaming. Each turn renders the whole
// conversation with the model's chat format (K3 XTML), prefills it, and streams the reply through
// the output parser: reasoning dimmed (or hidden with --hide-thinking), content plain, tool calls
// printed as JSON. `/image PATH` attaches an image to the next user message (docs/vision.md §7): it is decoded,
// preprocessed and encoded once, its placeholder rendered at its place in the conversation on every turn and its
// embedding rows written at the pads; `/exit` ends.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "app/args.h"
#include "app/commands.h"
#include "chat/k3_renderer.h"
#include "chat/model_tokenizer.h"
#include "chat/output_parser.h"
#include "chat/stream_decoder.h"
#include "runtime/engine.h"
#include "runtime/image_input.h"
#include "runtime/sampler.h"

namespace kestrel::app {

namespace {
int fail(const Status& s) {
  std::fprintf(stderr, "kestrel chat: %s\n", s.message().c_str());
  return 1;
}
}  // namespace

int cmd_chat(const std::vector<std::string>& argv) {
  int exit_code = 0;
  auto a = Args::parse("chat", argv, exit_code);
  if (!a) return exit_code;
  auto max_tokens = a->integer("max-tokens");
  auto temp = a->number("temperature");
  auto top_p = a->number("top-p");
  auto seed = a->integer("seed");
  if (Status s = first_error(max_tokens, temp, top_p, seed); !s.is_ok()) return usage_error("chat", s);
  if (*max_tokens < 1 || *temp < 0 || *top_p <= 0 || *top_p > 1)
    return usage_error("chat", invalid_argument("--max-tokens must be ≥ 1, --temperature ≥ 0, --top-p in (0, 1]"));
  chat::ChatRequest req;
  req.thinking = !a->has("no-thinking");
  if (a->has("effort")) {
    auto e = chat::parse_thinking_effort(a->str("effort"));
    if (!e) return usage_error("chat", e.error());
    req.thinking_effort = *e;
  }
  int rc = 0;
  const std::string dir = resolve_model_or_default(a->str("model"), !a->has("quiet"), rc, a->str("preset"));
  if (rc) return rc;
  auto tok = chat::load_model_tokenizer(dir);
  if (!tok) return fail(tok.error());
  auto eng = Engine::load(dir);
  if (!eng) return fail(eng.error());
  print_load_notes(**eng, dir, !a->has("quiet"));
  auto message = [](chat::Role role, std::string text) {
    chat::Message m;
    m.role = role;
    m.content = std::move(text);
    return m;
  };
  if (a->has("system")) req.messages.push_back(message(chat::Role::kSystem, a->str("system")));
  const auto eos = tok->special_id("<|end_of_msg|>");
  const bool tty = ::isatty(STDOUT_FILENO);
  const char* dim = tty ? "\x1b[2m" : "";
  const char* reset = tty ? "\x1b[0m" : "";
  Sampler sampler(SamplingParams{static_cast<float>(*temp), 0, static_cast<float>(*top_p), 0.0f, static_cast<uint64_t>(*seed)});
  // The conversation's images in order: their placeholders and embedding rows; `attached` of them (the last ones)
  // wait for the next user message.
  std::vector<std::string> image_prompts;
  std::vector<float> media;
  size_t attached = 0;
  std::string line;
  while (true) {
    if (tty) std::printf("\n> "), std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line.rfind("/image", 0) == 0 && (line.size() == 6 || line[6] == ' ')) {
      const std::string path = line.size() > 7 ? line.substr(7) : std::string();
      auto added = [&]() -> Result<int64_t> {
        if (path.empty()) return invalid_argument("/image needs a file: /image PATH");
        if (!(*eng)->has_vision()) return unsupported("the model has no vision tower; /image needs one");
        auto bytes = read_image_file(path, "/image " + path);
        if (!bytes) return bytes.error();
        auto prepared = prepare_images(std::span<const std::vector<uint8_t>>(&*bytes, 1), ImageRequestLimits{});
        if (!prepared) return prepared.error();
        auto rows = embed_images(**eng, *prepared);
        if (!rows) return rows.error();
        image_prompts.push_back(prepared->prompts[0]);
        media.insert(media.end(), rows->begin(), rows->end());
        ++attached;
        return prepared->tokens;
      }();
      // A bad file is reported and the chat goes on.
      if (!added) std::fprintf(stderr, "kestrel chat: %s\n", added.error().message().c_str());
      else std::fprintf(stderr, "kestrel chat: attached %s (%lld image tokens) to the next message\n", path.c_str(),
                        static_cast<long long>(*added));
      continue;
    }
    chat::Message user = message(chat::Role::kUser, line);
    if (attached > 0) {
      user.has_parts = true;
      for (size_t i = 0; i < attached; ++i) user.parts.push_back({chat::ContentPart::Kind::kImage, {}});
      user.parts.push_back({chat::ContentPart::Kind::kText, line});
      attached = 0;
    }
    req.messages.push_back(std::move(user));
    if (!image_prompts.empty()) req.image_prompts = image_prompts;
    auto segs = chat::render_k3_segments(req);
    if (!segs) return fail(segs.error());
    const std::vector<int32_t> ids = chat::encode_segments(*tok, *segs);
    SequenceState seq = (*eng)->new_sequence();
    auto logits = media.empty() ? (*eng)->prefill(seq, ids, 512) : (*eng)->prefill_media(seq, ids, media, 512);
    if (!logits) return fail(logits.error());
    std::vector<float> cur = std::move(*logits);
    chat::OutputParser parser(chat::OutputParserOptions{chat::OutputFormat::kKimiK3, req.thinking});
    chat::StreamDecoder sd(*tok);
    chat::Message reply = message(chat::Role::kAssistant, "");
    std::string reasoning, content;
    auto show = [&](const chat::ParseDelta& d) {
      if (!d.reasoning_content.empty() && !a->has("hide-thinking"))
        std::printf("%s%s%s", dim, d.reasoning_content.c_str(), reset);
      if (!d.content.empty()) std::printf("%s", d.content.c_str());
      for (const auto& c : d.tool_calls) std::printf("\n[tool call %s(%s)]\n", c.name.c_str(), c.arguments.c_str());
      reasoning += d.reasoning_content, content += d.content;
      std::fflush(stdout);
    };
    for (long long i = 0; i < *max_tokens; ++i) {
      const int32_t t = sampler.sample(cur);
      if (eos && t == *eos) break;
      auto piece = sd.push(t);
      if (!piece) return fail(piece.error());
      show(parser.push(*piece));
      if (parser.finished()) break;
      if (!(*eng)->decode_into(seq, t, cur).is_ok()) break;
    }
    show(parser.push(sd.flush()));
    show(parser.finish());
    std::printf("\n");
    reply.content = content;
    if (!reasoning.empty()) reply.reasoning_content = reasoning;
    req.messages.push_back(reply);
  }
  return 0;
}

}  // namespace kestrel::app
