// The bootstrap exchange between a decode instance and a prefill instance (docs/disaggregation.md §4). The
// router gives the decode half of a request the prefill's bootstrap host and port; before its first hand-off from
// that prefill, the decode instance posts
//   POST /kestrel/pd/v1/handshake  {"fingerprint": F, "instance": "<u64>", "address": "<hex UCX worker address>"}
// and the prefill answers 200 with the same three fields of its own after connecting to the decode's address,
// or 409 {"error": {...}} when the fingerprints differ (another model, kernels mode or cache layout: a hand-off
// between them would decode garbage), 400 for a malformed body, 503 when it cannot connect. The decode then
// connects to the prefill's address. Bounded: the client gives up after `timeout`.
// A prefill instance whose transports include tcp answers with "port" too, the port of its UCX listener: it does
// not connect to the decode's address then, the decode instance connects to that port on the bootstrap host
// (a UCX client-server connection; docs/disaggregation.md, "Link down over tcp").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel::pd {

inline constexpr const char* kHandshakePath = "/kestrel/pd/v1/handshake";

struct Hello {
  std::string fingerprint;
  uint64_t instance = 0;
  std::vector<std::byte> address;
  uint16_t port = 0;  // the prefill's UCX listener (0: none, connect by address)
};

std::string encode_hello(const Hello& h);
// kInvalidArgument for a malformed body.
Result<Hello> decode_hello(const std::string& body);

// The decode side's POST; kInvalidArgument when the prefill refuses the fingerprint (409), kUnavailable when it
// cannot be reached or answers another error (its message kept).
Result<Hello> post_handshake(const std::string& host, int port, const Hello& mine, std::chrono::milliseconds timeout);

}  // namespace kestrel::pd
