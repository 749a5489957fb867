// The bootstrap handshake's body (pd/bootstrap.h) and the first-token record (pd/first_token.h): round trips, and
// every malformed input refused.
#include <gtest/gtest.h>

#include <array>

#include "pd/bootstrap.h"
#include "pd/first_token.h"

namespace kestrel::pd {
namespace {

TEST(Bootstrap, HelloRoundTrip) {
  Hello h{"weights=ab|kernels=exact|pd=1", 18446744073709551615ull, {std::byte{0}, std::byte{0xff}, std::byte{0x1a}}};
  auto back = decode_hello(encode_hello(h));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->fingerprint, h.fingerprint);
  EXPECT_EQ(back->instance, h.instance);
  EXPECT_EQ(back->address, h.address);
  EXPECT_EQ(back->port, 0) << "no listener: no port";
  EXPECT_EQ(encode_hello(h).find("port"), std::string::npos);
  h.port = 65535;
  back = decode_hello(encode_hello(h));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->port, 65535);
}

TEST(Bootstrap, MalformedHelloRefused) {
  for (const char* body : {"", "[]", "{}", R"({"fingerprint":"f","instance":"1"})",
                           R"({"fingerprint":"f","instance":1,"address":"00"})",
                           R"({"fingerprint":"f","instance":"-1","address":"00"})",
                           R"({"fingerprint":"f","instance":"123456789012345678901","address":"00"})",
                           R"({"fingerprint":"f","instance":"1","address":"0"})",
                           R"({"fingerprint":"f","instance":"1","address":"zz"})",
                           R"({"fingerprint":"f","instance":"1","address":""})",
                           R"({"fingerprint":"f","instance":"1","address":"00","port":0})",
                           R"({"fingerprint":"f","instance":"1","address":"00","port":65536})",
                           R"({"fingerprint":"f","instance":"1","address":"00","port":-1})",
                           R"({"fingerprint":"f","instance":"1","address":"00","port":"80"})"}) {
    EXPECT_FALSE(decode_hello(body)) << body;
  }
}

TEST(Bootstrap, UnreachablePrefillIsUnavailable) {
  // Port 1 on loopback: nothing listens there.
  auto r = post_handshake("127.0.0.1", 1, Hello{"f", 1, {std::byte{1}}}, std::chrono::milliseconds(500));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.error().message().find("unreachable"), std::string::npos) << r.error().message();
}

TEST(FirstToken, RecordRoundTripAndLimits) {
  GenerationEvent ev;
  ev.token = 4242;
  ev.logprob = -1.25f;
  for (int i = 0; i < 20; ++i) ev.top.push_back({i * 3, -0.5f * static_cast<float>(i)});
  std::array<std::byte, kRecordBytes> rec{};
  ASSERT_TRUE(encode_first_token(ev, rec).is_ok());
  auto back = decode_first_token(rec);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->token, ev.token);
  EXPECT_EQ(back->logprob, ev.logprob);
  ASSERT_EQ(back->top.size(), ev.top.size());
  for (size_t i = 0; i < ev.top.size(); ++i) {
    EXPECT_EQ(back->top[i].id, ev.top[i].id);
    EXPECT_EQ(back->top[i].logprob, ev.top[i].logprob);
  }
  ev.top.push_back({1, 0.0f});
  EXPECT_FALSE(encode_first_token(ev, rec).is_ok()) << "21 alternatives do not fit";
  std::array<std::byte, kRecordBytes> zero{};
  EXPECT_FALSE(decode_first_token(zero)) << "a record never written (zeros) must not decode";
  rec[12] = std::byte{21};  // top count beyond the record
  EXPECT_FALSE(decode_first_token(rec));
}

}  // namespace
}  // namespace kestrel::pd
