#include "chat/stream_decoder.h"

#include "chat/utf8.h"

namespace kestrel::chat {

Result<std::string> StreamDecoder::push(int32_t id) {
  const auto bytes = tokenizer_->token_bytes(id);
  if (!bytes) return invalid_argument("stream decode: id " + std::to_string(id) + " is not in the vocabulary");
  return push_bytes(*bytes);
}

std::string StreamDecoder::push_bytes(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const std::string_view p(pending_);
  size_t i = 0;
  while (i < p.size()) {
    const Utf8Scan r = utf8_scan(p, i);
    if (r.valid) {
      out.append(p.substr(i, r.len));
    } else if (r.truncated) {
      break;  // could still be completed by the next token
    } else {
      out.append(kReplacementChar);
    }
    i += r.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacementChar);
  pending_.clear();
  return out;
}

}  // namespace kestrel::chat
