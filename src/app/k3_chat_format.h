// The server's ChatFormat for Kimi K3: OpenAI messages → XTML segments (chat/k3_renderer) → ids,
// and generated text → reasoning / content / tool calls (chat/output_parser). Immutable and
// thread-safe after construction.
#pragma once

#include <memory>

#include "chat/tokenizer.h"
#include "server/chat_format.h"

namespace kestrel::app {

class K3ChatFormat final : public server::ChatFormat {
 public:
  explicit K3ChatFormat(const chat::Tokenizer& tok);
  Result<std::vector<int32_t>> render(const server::RenderInput& input) const override;
  std::unique_ptr<server::OutputParser> make_output_parser(const server::ReasoningOptions& reasoning) const override;
  std::vector<int32_t> stop_token_ids() const override { return stops_; }

 private:
  const chat::Tokenizer& tok_;
  std::vector<int32_t> stops_;
};

}  // namespace kestrel::app
