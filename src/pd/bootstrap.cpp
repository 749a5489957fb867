#include "pd/bootstrap.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace kestrel::pd {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using json = nlohmann::json;

namespace {

std::string hex(const std::vector<std::byte>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) s += d[static_cast<unsigned>(x) >> 4], s += d[static_cast<unsigned>(x) & 15];
  return s;
}

bool unhex(const std::string& s, std::vector<std::byte>& out) {
  if (s.size() % 2 != 0) return false;
  auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < s.size(); i += 2) {
    const int hi = v(s[i]), lo = v(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<std::byte>(hi * 16 + lo));
  }
  return true;
}

}  // namespace

std::string encode_hello(const Hello& h) {
  json j{{"fingerprint", h.fingerprint}, {"instance", std::to_string(h.instance)}, {"address", hex(h.address)}};
  if (h.port != 0) j["port"] = h.port;
  return j.dump();
}

Result<Hello> decode_hello(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("fingerprint") || !j["fingerprint"].is_string() || !j.contains("instance") ||
      !j["instance"].is_string() || !j.contains("address") || !j["address"].is_string())
    return invalid_argument("handshake: expected {fingerprint, instance, address} strings");
  Hello h;
  h.fingerprint = j["fingerprint"].get<std::string>();
  const std::string inst = j["instance"].get<std::string>();
  if (inst.empty() || inst.size() > 20 || inst.find_first_not_of("0123456789") != std::string::npos)
    return invalid_argument("handshake: bad instance id");
  h.instance = std::stoull(inst);
  if (!unhex(j["address"].get<std::string>(), h.address) || h.address.empty())
    return invalid_argument("handshake: bad worker address");
  if (j.contains("port")) {
    if (!j["port"].is_number_unsigned() || j["port"].get<uint64_t>() == 0 || j["port"].get<uint64_t>() > 65535)
      return invalid_argument("handshake: bad listener port");
    h.port = static_cast<uint16_t>(j["port"].get<uint64_t>());
  }
  return h;
}

Result<Hello> post_handshake(const std::string& host, int port, const Hello& mine, std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  try {
    net::io_context io;
    net::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(timeout);
    stream.connect(resolver.resolve(host, std::to_string(port)));
    http::request<http::string_body> req{http::verb::post, kHandshakePath, 11};
    req.set(http::field::host, where);
    req.set(http::field::content_type, "application/json");
    req.body() = encode_hello(mine);
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    beast::error_code ec;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
    if (res.result_int() != 200) {
      json j = json::parse(res.body(), nullptr, false);
      std::string msg = j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message")
                            ? j["error"]["message"].get<std::string>()
                            : res.body();
      // A mismatch is a configuration error, not worth a retry; anything else may pass.
      return Status(res.result_int() == 409 ? StatusCode::kInvalidArgument : StatusCode::kUnavailable,
                    "prefill bootstrap " + where + " refused the handshake (HTTP " + std::to_string(res.result_int()) +
                        "): " + msg);
    }
    auto h = decode_hello(res.body());
    if (!h) return unavailable("prefill bootstrap " + where + ": " + h.error().message());
    return h;
  } catch (const std::exception& e) {
    return unavailable("prefill bootstrap " + where + " unreachable: " + e.what());
  }
}

}  // namespace kestrel::pd
