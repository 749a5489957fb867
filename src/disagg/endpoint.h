// Endpoint: a UCX endpoint to one peer worker, created from the peer's packed worker address (same host, or any
// host the address's transports reach) or from a sockaddr (a client connecting to a Listener, TCP across hosts).
// With PeerFailure::kUcx (worker.h) a peer that dies or whose connection breaks makes UCX call the error handler,
// which marks the endpoint failed; so does mark_failed() (a missed deadline, a silent peer). A failed endpoint
// sends nothing more and must be closed.
//
// Whether the peer can still write into memory advertised through this endpoint (region_registry.h):
//   kUcx (tcp): every write arrives over the connection, which a close tears down (forced close when failed), so
//       once closed() the peer cannot write.
//   kHeartbeat (shared memory): a peer on the same host writes directly (cma: process_vm_writev into this process;
//       posix/sysv: through the shared segments), whatever this side's endpoint does; and a forced close is not
//       allowed without UCX's peer failure mode. So the peer can write for as long as its process exists; see
//       peer_may_write().
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
#include "disagg/peer_segments.h"
#include "disagg/worker.h"

namespace kestrel::disagg {

class Endpoint {
 public:
  static Result<std::unique_ptr<Endpoint>> connect_address(Worker& worker, std::span<const std::byte> address);
  static Result<std::unique_ptr<Endpoint>> connect_sockaddr(Worker& worker, const std::string& host, uint16_t port);
  // For Listener: the server side of an incoming connection. Its peer() is the client worker's instance id
  // (sent with the request: connect_sockaddr asks UCX to send the worker's client id, which Worker sets to it).
  static Result<std::unique_ptr<Endpoint>> accept(Worker& worker, ucp_conn_request_h request);
  ~Endpoint();  // closes if still open (bounded by one second); destroy endpoints before their worker
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  uint64_t id() const { return id_; }  // unique in this process, never reused
  Worker& worker() const { return worker_; }
  ucp_ep_h handle() const { return ep_; }

  bool failed() const { return !failure_.is_ok(); }
  const Status& failure() const { return failure_; }
  // Gives up on the peer: no more sends; the first reason given is kept.
  void mark_failed(Status reason);

  // The peer's instance id (messages.h header), when known: from the bootstrap, or from its first message.
  std::optional<uint64_t> peer() const { return peer_; }
  void set_peer(uint64_t instance) { peer_ = instance; }

  // Sends one control message eagerly and waits for its local completion. kUnavailable if the endpoint has failed
  // or fails meanwhile; a missed deadline marks it failed. The message is copied: the caller's buffer is free on
  // return, whatever happened.
  Status send(std::span<const std::byte> message, MessageKind kind, Deadline deadline);
  // Periodic liveness message (called by Worker::progress); at most one outstanding, skipped once failed.
  void send_heartbeat();

  // kUnavailable without asking UCX when peer_gone(): unpacking the key of a shared-memory region maps the
  // region into this process (posix/sysv), and in UCX 1.13 an unpack whose segment is gone (its owner exited)
  // crashes in UCX's error path (ucp_ep_rkey_unpack releases the key it did not finish unpacking). Before the
  // check, a same-host peer's System V segments are attached here (PeerSegments, until close()), so that one
  // that dies right after the check leaves its segments in place for UCX's attach.
  Result<RemoteKey> unpack_rkey(std::span<const std::byte> packed);
  // The key unpacked once per endpoint and kept until the endpoint is closed: a peer advertises the same regions
  // (registered once) with every transfer, and a fresh unpack per transfer would map the region anew and fault in
  // every page it writes. Once mapped here a region outlives its owner's process until the key is released, so a
  // key unpacked while the peer ran stays usable (puts into it land in memory nobody reads). A key that failed
  // to unpack is not tried again on this endpoint: its error is returned.
  Result<const RemoteKey*> cached_rkey(std::span<const std::byte> packed);

  // True when this side can tell that the peer's process has exited or is being killed (kHeartbeat: a peer on
  // the same host, the pid its messages carry: gone, a zombie, exiting, or with SIGKILL pending). False when it
  // cannot tell: kUcx (the peer may be on another host; UCX's error handler reports its death), or no message
  // from the peer yet.
  bool peer_gone() const;

  // kUcx: a healthy endpoint is flushed (remote completion) within the deadline, then closed with
  // UCP_EP_CLOSE_FLAG_FORCE, which completes at once and cancels whatever is outstanding (also after a flush that
  // missed the deadline, or on a failed endpoint). kHeartbeat: closed in UCX's flush mode within the deadline;
  // one that does not finish in time stays closing (kUnavailable; call again). Idempotent once closed.
  Status close(Deadline deadline);
  bool closed() const { return closed_; }
  // False only once nothing of the peer's can land in memory advertised through this endpoint: kUcx: closed();
  // kHeartbeat: closed() and the peer's process (the pid its messages carry) has exited (kill -9 included).
  bool peer_may_write() const;

  // The UCX transports the endpoint's lanes use, e.g. {"tcp"} or {"cma", "sysv"} (from ucp_ep_print_info).
  std::vector<std::string> transports() const;

 private:
  explicit Endpoint(Worker& worker);
  static Result<std::unique_ptr<Endpoint>> create(Worker& worker, ucp_ep_params_t& params, const char* what);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Frees the finished requests among sends_; returns how many are still outstanding.
  size_t reap_sends();

  struct Send {
    void* request;
    std::vector<std::byte> bytes;  // the message, alive until the request completes
    bool heartbeat;
  };

  Worker& worker_;
  uint64_t id_;
  ucp_ep_h ep_ = nullptr;
  Status failure_;
  bool closed_ = false;
  void* close_request_ = nullptr;  // a close in progress (kHeartbeat mode)
  std::optional<uint64_t> peer_;
  std::vector<Send> sends_;  // outstanding sends (heartbeats included)
  struct CachedKey {
    std::vector<std::byte> packed;
    std::unique_ptr<RemoteKey> key;  // null: the unpack failed with `error`
    Status error;
  };
  PeerSegments segments_;  // a same-host peer's segments, attached before its keys are unpacked (declared first:
                           // destroyed after the keys)
  std::vector<CachedKey> rkeys_;
  size_t heartbeats_outstanding_ = 0;
};

}  // namespace kestrel::disagg
