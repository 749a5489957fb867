#include "media/data_url.h"

#include <array>
#include <cctype>

namespace kestrel::media {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && lower(s.substr(0, prefix.size())) == prefix;
}

constexpr std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr std::array<int8_t, 256> kTable = make_table();

}  // namespace

Result<std::vector<uint8_t>> base64_decode_strict(std::string_view text, size_t max_decoded_bytes) {
  if (text.empty()) return invalid_argument("base64: empty payload");
  if (text.size() % 4 != 0) return invalid_argument("base64: length is not a multiple of 4");
  size_t pad = 0;
  if (text.back() == '=') pad = text[text.size() - 2] == '=' ? 2 : 1;
  const size_t out_size = text.size() / 4 * 3 - pad;
  if (out_size > max_decoded_bytes)  // before any allocation
    return too_large("base64: payload decodes to " + std::to_string(out_size) + " bytes, over the limit of " +
                     std::to_string(max_decoded_bytes));
  std::vector<uint8_t> out;
  out.reserve(out_size);
  const size_t data_end = text.size() - pad;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int n = 0;
    for (size_t j = i; j < i + 4; ++j) {
      if (j >= data_end) break;
      const int8_t d = kTable[static_cast<unsigned char>(text[j])];
      if (d < 0) return invalid_argument("base64: invalid character at offset " + std::to_string(j));
      v |= uint32_t(d) << (18 - 6 * n);
      ++n;
    }
    out.push_back(static_cast<uint8_t>(v >> 16));
    if (n >= 3) out.push_back(static_cast<uint8_t>(v >> 8));
    if (n == 4) out.push_back(static_cast<uint8_t>(v));
  }
  return out;
}

Result<DataUrl> parse_image_url(std::string_view url, const DataUrlLimits& limits) {
  if (starts_with_ci(url, "http://") || starts_with_ci(url, "https://"))
    return unsupported("image_url: remote http(s) URLs are not fetched by this server; send the image inline as "
                       "a data:image/...;base64 URL");
  if (starts_with_ci(url, "file:"))
    return unsupported("image_url: file: URLs are refused; send the image inline as a data:image/...;base64 URL");
  if (!starts_with_ci(url, "data:"))
    return invalid_argument("image_url: expected a data:image/...;base64 URL");
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) return invalid_argument("image_url: data URL without a comma");
  // Size check on the encoded length first: 4 characters carry at most 3 bytes.
  const std::string_view payload = url.substr(comma + 1);
  if (payload.size() / 4 * 3 > limits.max_decoded_bytes + 3)
    return too_large("image_url: data URL payload is " + std::to_string(payload.size()) +
                     " characters, over the limit of " + std::to_string(limits.max_decoded_bytes) + " decoded bytes");
  const std::string header = lower(url.substr(5, comma - 5));  // "image/png;base64"
  const std::string suffix = ";base64";
  if (header.size() < suffix.size() || header.compare(header.size() - suffix.size(), suffix.size(), suffix) != 0)
    return invalid_argument("image_url: data URL must be base64-encoded (;base64,)");
  DataUrl out;
  out.mime_type = header.substr(0, header.find(';'));
  if (out.mime_type.rfind("image/", 0) != 0 || out.mime_type.size() == 6)
    return invalid_argument("image_url: data URL media type must be image/...");
  Result<std::vector<uint8_t>> bytes = base64_decode_strict(payload, limits.max_decoded_bytes);
  if (!bytes) return Status(bytes.error().code(), "image_url: " + bytes.error().message());
  out.bytes = std::move(*bytes);
  return out;
}

}  // namespace kestrel::media
