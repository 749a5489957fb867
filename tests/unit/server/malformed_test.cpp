// Replays tests/integration/server_malformed/cases.jsonl over raw TCP: every case must get a 4xx (the exact
// code where the case names one) and the server must keep serving (a normal request succeeds after each batch).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/vocab_path.h"
#include "server/api_handlers.h"
#include "server/http_server.h"
#include "test_support.h"

namespace kestrel::server {
namespace {

using nlohmann::json;
using testing::RawClient;

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

// JSON strings hold the raw bytes as code points 0..255 (latin-1).
std::string latin1(const json& s) {
  std::string utf8 = s.get<std::string>(), out;
  for (size_t i = 0; i < utf8.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {  // two-byte sequence for U+0080..U+00FF
      out.push_back(static_cast<char>(((c & 0x1f) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3f)));
      ++i;
    }
  }
  return out;
}

std::string build(const json& c) {
  if (c.contains("raw")) {
    std::string s = latin1(c["raw"]);
    if (c.contains("raw_repeat")) {
      const auto& r = c["raw_repeat"];
      std::string unit = latin1(r[0]);
      for (int i = 0; i < r[1].get<int>(); ++i) s += unit;
      s += latin1(r[2]);
    }
    return s;
  }
  std::string body;
  if (c.contains("body_hex")) body = from_hex(c["body_hex"]);
  else if (c.contains("body_repeat")) {
    const auto& r = c["body_repeat"];
    body = r[0].get<std::string>();
    std::string unit = r[1];
    for (int i = 0; i < r[2].get<int>(); ++i) body += unit;
    body += r[3].get<std::string>();
  } else if (c.contains("body")) {
    body = latin1(c["body"]);
  }
  std::string head = c["method"].get<std::string>() + " " + c["path"].get<std::string>() + " HTTP/1.1\r\nHost: x\r\n";
  bool has_ct = false;
  if (c.contains("headers"))
    for (const auto& h : c["headers"]) {
      head += h[0].get<std::string>() + ": " + h[1].get<std::string>() + "\r\n";
      has_ct = has_ct || h[0] == "Content-Type";
    }
  if (!has_ct && c["method"] == "POST") head += "Content-Type: application/json\r\n";
  if (c.contains("header_repeat")) {
    const auto& r = c["header_repeat"];
    for (int i = 0; i < r[2].get<int>(); ++i) head += r[0].get<std::string>() + ": " + r[1].get<std::string>() + "\r\n";
  }
  head += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  return head + body;
}

TEST(Malformed, EveryCaseGets4xxAndServerKeepsServing) {
  auto tok = chat::Tokenizer::create(chat::cl100k_config(kestrel::testing::vocab_file("cl100k_base")));
  ASSERT_TRUE(tok);
  testing::FakeEngine engine(tok->encode("ok then", chat::SpecialMode::kAsText));
  testing::TrivialFormat format(*tok);
  ApiServer api(ApiConfig{}, engine, *tok, format);
  HttpServerOptions opt;
  opt.port = 0;
  opt.max_body_bytes = 1 << 20;
  opt.read_timeout = std::chrono::milliseconds(2000);
  HttpServer server(opt, api.make_router());
  ASSERT_TRUE(server.start().is_ok());

  std::ifstream in(std::string(KESTREL_MALFORMED_DIR) + "/cases.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int count = 0;
  auto healthy = [&] {
    RawClient c(server.port());
    c.send(testing::http_post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})"));
    return c.read_response().status == 200;
  };
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json c = json::parse(line);
    std::string name = c["name"];
    auto t0 = std::chrono::steady_clock::now();
    RawClient client(server.port());
    ASSERT_TRUE(client.ok()) << name;
    client.send(build(c));  // may fail part-way when the server answers early and closes
    auto r = client.read_response(std::chrono::milliseconds(4000));
    EXPECT_GE(r.status, 400) << name << "\n" << r.head << r.body;
    EXPECT_LT(r.status, 500) << name << "\n" << r.head << r.body;
    if (c.contains("status")) {
      EXPECT_EQ(r.status, c["status"].get<int>()) << name << "\n" << r.body;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << name;
    if (++count % 10 == 0) {
      ASSERT_TRUE(healthy()) << "after " << name;
    }
  }
  EXPECT_EQ(count, 191);  // every line of cases.jsonl ran (docs/STATUS.md: 191 malformed requests)
  EXPECT_TRUE(healthy());
}

}  // namespace
}  // namespace kestrel::server
