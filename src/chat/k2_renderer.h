// Kimi K2 / Kimi Linear prompt renderer (`<|im_user|>…<|im_middle|>…<|im_end|>`), as segments and ids.
//
// Port of the Kimi-K2-Instruct chat template (moonshotai/Kimi-K2-Instruct tokenizer_config.json `chat_template`;
// llama.cpp vendors it as models/templates/Kimi-K2-Instruct.jinja), byte-exact with its jinja render
// (trim_blocks, lstrip_blocks, HF `tojson`), including its quirks: a default system message (followed by "\n")
// when the first message is not a system one; tool-call ids `functions.NAME:N` with N counting every call of the
// conversation; tool results rendered as `## Return of ID\n…` under `<|im_system|>`; image parts as
// `<|media_start|>image<|media_content|><|media_pad|><|media_end|>\n`; tool declarations as json.dumps (unsorted).
// The template renders one string that HF tokenizes whole; here markers are structural segments and all
// message text is ordinary text, so content cannot forge `<|im_end|>`. Reasoning is not rendered (Instruct).
// Thread-safe: pure functions.
#pragma once

#include <vector>

#include "base/result.h"
#include "chat/chat_types.h"

namespace kestrel::chat {

// Uses messages, tools and add_generation_prompt of the request; thinking options do not apply to K2-Instruct.
Result<std::vector<Segment>> render_k2_segments(const ChatRequest& request);

}  // namespace kestrel::chat
