#include <gtest/gtest.h>

#include "media/data_url.h"
#include "media/image_decode.h"
#include "test_util.h"

namespace kestrel::media {
namespace {

std::string b64(const std::vector<uint8_t>& b) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  for (size_t i = 0; i < b.size(); i += 3) {
    uint32_t v = uint32_t(b[i]) << 16;
    if (i + 1 < b.size()) v |= uint32_t(b[i + 1]) << 8;
    if (i + 2 < b.size()) v |= b[i + 2];
    s += a[v >> 18], s += a[(v >> 12) & 63];
    s += i + 1 < b.size() ? a[(v >> 6) & 63] : '=';
    s += i + 2 < b.size() ? a[v & 63] : '=';
  }
  return s;
}

TEST(DataUrl, RoundTripsAFixture) {
  const std::vector<uint8_t> png = test::read_fixture("la.png");
  Result<DataUrl> u = parse_image_url("data:image/png;base64," + b64(png));
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u->mime_type, "image/png");
  EXPECT_EQ(u->bytes, png);
  EXPECT_TRUE(decode_image(u->bytes));
  Result<DataUrl> upper = parse_image_url("DATA:Image/PNG;BASE64," + b64(png));
  ASSERT_TRUE(upper);
  EXPECT_EQ(upper->mime_type, "image/png");
}

TEST(DataUrl, Base64Vectors) {  // RFC 4648 §10
  const std::pair<const char*, const char*> v[] = {{"Zg==", "f"}, {"Zm8=", "fo"}, {"Zm9v", "foo"},
                                                   {"Zm9vYg==", "foob"}, {"Zm9vYmE=", "fooba"}, {"Zm9vYmFy", "foobar"}};
  for (auto [enc, dec] : v) {
    Result<std::vector<uint8_t>> r = base64_decode_strict(enc, 100);
    ASSERT_TRUE(r) << enc;
    EXPECT_EQ(std::string(r->begin(), r->end()), dec);
  }
}

TEST(DataUrl, MalformedBase64IsRefused) {
  for (const char* bad : {"Zm9", "Zm9v\n", "Zm 9v", "Zm9v====", "=Zm9", "Zm=v", "Zm9-", "Zm9_", "Z===", "", "Zg=a"}) {
    Result<std::vector<uint8_t>> r = base64_decode_strict(bad, 100);
    EXPECT_FALSE(r) << bad;
  }
  Result<DataUrl> u = parse_image_url("data:image/png;base64,iVBO!w0KGgo=");
  ASSERT_FALSE(u);
  EXPECT_NE(u.error().message().find("invalid character"), std::string::npos);
}

TEST(DataUrl, OversizedIsRefusedBeforeDecoding) {
  DataUrlLimits lim;
  lim.max_decoded_bytes = 1000;
  const std::string url = "data:image/png;base64," + std::string(4000, 'A');
  Result<DataUrl> u = parse_image_url(url, lim);
  ASSERT_FALSE(u);
  EXPECT_EQ(u.error().code(), StatusCode::kTooLarge);
  // Exactly at the limit passes (999 bytes = 1332 characters).
  EXPECT_TRUE(base64_decode_strict(std::string(1332, 'A'), 999));
  EXPECT_FALSE(base64_decode_strict(std::string(1336, 'A'), 1000));
}

TEST(DataUrl, RemoteAndFileUrlsAreRefused) {
  for (const char* url : {"http://example.com/a.png", "https://example.com/a.png", "HTTPS://x/y", "file:///etc/passwd",
                          "file:a.png"}) {
    Result<DataUrl> u = parse_image_url(url);
    ASSERT_FALSE(u) << url;
    EXPECT_EQ(u.error().code(), StatusCode::kUnsupported);
    EXPECT_NE(u.error().message().find("data:image/"), std::string::npos);
  }
  Result<DataUrl> http = parse_image_url("http://example.com/a.png");
  EXPECT_NE(http.error().message().find("not fetched"), std::string::npos);
}

TEST(DataUrl, OtherShapesAreRefused) {
  for (const char* url : {"ftp://x", "data:image/png,iVBORw0KGgo=", "data:text/plain;base64,Zm9v", "data:image/png;base64",
                          "data:;base64,Zm9v", "data:image/;base64,Zm9v", "iVBORw0KGgo="}) {
    EXPECT_FALSE(parse_image_url(url)) << url;
  }
}

}  // namespace
}  // namespace kestrel::media
