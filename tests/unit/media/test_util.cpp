#include "test_util.h"

#include <openssl/evp.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace kestrel::media::test {

std::vector<uint8_t> read_fixture(const std::string& name) {
  std::ifstream f(std::string(KESTREL_VISION_DATA) + "/" + name, std::ios::binary);
  if (!f) throw std::runtime_error("missing fixture " + name + " (tools/gen_vision_goldens.py)");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string sha256_hex(const void* data, size_t n) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) s += hex[md[i] >> 4], s += hex[md[i] & 15];
  return s;
}

}  // namespace kestrel::media::test
