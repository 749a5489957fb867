// Listener: accepts UCX client-server connections on a TCP address (the prefill side's transfer port; decode
// instances connect with Endpoint::connect_sockaddr). Requests arrive during the worker's progress and become
// Endpoints in accept().
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "base/result.h"
#include "disagg/deadline.h"
#include "disagg/endpoint.h"
#include "disagg/worker.h"

namespace kestrel::disagg {

class Listener {
 public:
  // host "0.0.0.0" (any interface) or an address; port 0 picks a free port (see port()).
  static Result<std::unique_ptr<Listener>> create(Worker& worker, const std::string& host, uint16_t port);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  uint16_t port() const { return port_; }
  // A connection request has arrived (during the worker's progress) and waits for accept().
  bool pending() const { return !pending_.empty(); }
  // The next incoming connection as an Endpoint, waiting until the deadline (kUnavailable when none came).
  Result<std::unique_ptr<Endpoint>> accept(Deadline deadline);

 private:
  explicit Listener(Worker& worker) : worker_(worker) {}
  static void on_connection(ucp_conn_request_h request, void* arg);

  Worker& worker_;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
  std::deque<ucp_conn_request_h> pending_;
};

}  // namespace kestrel::disagg
