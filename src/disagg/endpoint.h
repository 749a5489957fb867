// Endpoint: a UCX endpoint to one peer worker, created from the peer's packed worker address (same host, or any
// host the address's transports reach) or from a sockaddr (a client connecting to a Listener, TCP across hosts).
// Created with UCP_ERR_HANDLING_MODE_PEER: a peer that dies or whose connection breaks makes UCX call the error
// handler, which marks the endpoint failed; so does mark_failed() (a missed deadline or a silent peer). A failed
// endpoint sends nothing more and must be closed; close() is what lets memory advertised to the peer be reused
// (region_registry.h).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "disagg/deadline.h"
#include "disagg/memory.h"
#include "disagg/messages.h"
#include "disagg/worker.h"

namespace kestrel::disagg {

class Endpoint {
 public:
  static Result<std::unique_ptr<Endpoint>> connect_address(Worker& worker, std::span<const std::byte> address);
  static Result<std::unique_ptr<Endpoint>> connect_sockaddr(Worker& worker, const std::string& host, uint16_t port);
  // For Listener: the server side of an incoming connection.
  static Result<std::unique_ptr<Endpoint>> accept(Worker& worker, ucp_conn_request_h request);
  ~Endpoint();  // closes if still open (forced, bounded by one second)
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  uint64_t id() const { return id_; }  // unique in this process, never reused
  Worker& worker() const { return worker_; }
  ucp_ep_h handle() const { return ep_; }

  bool failed() const { return !failure_.is_ok(); }
  const Status& failure() const { return failure_; }
  // Gives up on the peer: no more sends; the first reason given is kept.
  void mark_failed(Status reason);
  bool closed() const { return closed_; }

  // The peer's instance id (messages.h header), when known: from the bootstrap, or from its first message.
  std::optional<uint64_t> peer() const { return peer_; }
  void set_peer(uint64_t instance) { peer_ = instance; }

  // Sends one control message eagerly and waits for its local completion. kUnavailable if the endpoint has failed
  // or fails meanwhile; on a missed deadline the endpoint is marked failed and closed (nothing may still read
  // the message's buffer).
  Status send(std::span<const std::byte> message, MessageKind kind, Deadline deadline);
  // Periodic liveness message (called by Worker::progress); fire and forget, skipped once failed.
  void send_heartbeat();

  Result<RemoteKey> unpack_rkey(std::span<const std::byte> packed);

  // Healthy endpoint: flushes outstanding operations (remote completion) within the deadline, then closes;
  // failed one (or a flush that misses the deadline): closes at once (UCP_EP_CLOSE_FLAG_FORCE), cancelling what is
  // outstanding. Afterwards the peer can no longer reach this process's memory through this endpoint.
  Status close(Deadline deadline);

  // The UCX transports the endpoint's lanes use, e.g. {"tcp"} or {"posix", "cma"} (from ucp_ep_print_info).
  std::vector<std::string> transports() const;

 private:
  Endpoint(Worker& worker);
  static Result<std::unique_ptr<Endpoint>> create(Worker& worker, ucp_ep_params_t& params, const char* what);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Waits for a request; on Ok or a request error it is freed (set to nullptr), on a missed deadline it is left
  // outstanding for the caller to release.
  Status wait_request(void*& request, Deadline deadline, const char* what);

  Worker& worker_;
  uint64_t id_;
  ucp_ep_h ep_ = nullptr;
  Status failure_;
  bool closed_ = false;
  std::optional<uint64_t> peer_;
  std::vector<std::byte> heartbeat_;
  void* heartbeat_request_ = nullptr;
};

}  // namespace kestrel::disagg
