#include "cache/block_hash.h"

#include <openssl/evp.h>

#include <memory>

#include "base/check.h"

namespace kestrel {
namespace {

// One incremental SHA-256 (OpenSSL EVP; the context is freed on scope exit).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    KCHECK(ctx_ && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1, "block_hash: SHA-256 init failed");
  }
  void update(const void* p, size_t n) {
    KCHECK(EVP_DigestUpdate(ctx_.get(), p, n) == 1, "block_hash: SHA-256 update failed");
  }
  void update_u64le(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    update(b, 8);
  }
  // Typed, length-prefixed field: no two field lists serialise to the same bytes.
  void field(uint8_t type, std::string_view s) {
    update(&type, 1);
    update_u64le(s.size());
    update(s.data(), s.size());
  }
  Digest finish() {
    Digest d{};
    unsigned int len = 0;
    KCHECK(EVP_DigestFinal_ex(ctx_.get(), d.data(), &len) == 1 && len == d.size(), "block_hash: SHA-256 final failed");
    return d;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

constexpr uint8_t kFieldDomain = 1, kFieldFingerprint = 2, kFieldSalt = 3;

}  // namespace

Digest chain_root(std::string_view model_fingerprint, std::string_view cache_salt) {
  Sha256 h;
  h.field(kFieldDomain, "kestrel-prefix-v1");
  h.field(kFieldFingerprint, model_fingerprint);
  h.field(kFieldSalt, cache_salt);
  return h.finish();
}

void extend_block_keys(const Digest& root, std::span<const int32_t> tokens, int64_t block_tokens,
                       std::vector<Digest>& out, std::span<const BlockExtraKey> extra) {
  KCHECK(block_tokens > 0, "extend_block_keys: block_tokens must be positive");
  for (size_t e = 0; e < extra.size(); ++e) {
    KCHECK(extra[e].position >= 0, "extend_block_keys: negative extra-key position");
    KCHECK(e == 0 || extra[e - 1].position <= extra[e].position, "extend_block_keys: extra keys not sorted");
  }
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_tokens;
  // First extra key at or after the first new block.
  size_t e = 0;
  const int64_t first = static_cast<int64_t>(out.size());
  while (e < extra.size() && extra[e].position < first * block_tokens) ++e;
  std::vector<uint8_t> buf(static_cast<size_t>(block_tokens) * 4);
  for (int64_t b = first; b < full; ++b) {
    Sha256 h;
    const Digest& prev = out.empty() ? root : out.back();
    h.update(prev.data(), prev.size());
    for (int64_t t = 0; t < block_tokens; ++t) {
      const auto v = static_cast<uint32_t>(tokens[static_cast<size_t>(b * block_tokens + t)]);
      for (int k = 0; k < 4; ++k) buf[static_cast<size_t>(t * 4 + k)] = static_cast<uint8_t>(v >> (8 * k));
    }
    h.update(buf.data(), buf.size());
    for (; e < extra.size() && extra[e].position < (b + 1) * block_tokens; ++e) {
      h.update_u64le(static_cast<uint64_t>(extra[e].position));
      h.update(extra[e].hash.data(), extra[e].hash.size());
    }
    out.push_back(h.finish());
  }
}

std::string to_hex(const Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(d.size() * 2, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

}  // namespace kestrel
