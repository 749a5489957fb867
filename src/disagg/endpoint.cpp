#include "disagg/endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "disagg/ucx_status.h"

namespace kestrel::disagg {
namespace {

std::atomic<uint64_t> g_next_endpoint_id{1};

// True when the request is finished (or there is none); a finished request is freed and its status stored.
bool finished(void*& request, ucs_status_t* status) {
  if (request == nullptr) return true;
  ucs_status_t st = ucp_request_check_status(request);
  if (st == UCS_INPROGRESS) return false;
  if (status != nullptr) *status = st;
  ucp_request_free(request);
  request = nullptr;
  return true;
}

// A process that still exists and is not a zombie (a zombie has exited; only its parent's wait is missing).
bool process_running(uint32_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  std::string stat;
  std::getline(f, stat);
  size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

// A running process that is not on its way out either: not exiting (PF_EXITING in the flags of /proc/PID/stat,
// set as soon as it starts to exit, before its memory is unmapped) and without a SIGKILL pending (SigPnd,
// ShdPnd in /proc/PID/status: sent, not yet acted on). Unreadable fields count as alive.
bool process_alive(uint32_t pid) {
  if (!process_running(pid)) return false;
  const std::string dir = "/proc/" + std::to_string(pid);
  {
    std::ifstream f(dir + "/stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    if (close != std::string::npos) {
      // After the command: state, ppid, pgrp, session, tty_nr, tpgid, flags.
      std::istringstream fields(stat.substr(close + 1));
      std::string skip;
      unsigned long flags = 0;
      for (int i = 0; i < 6; ++i) fields >> skip;
      constexpr unsigned long kPfExiting = 0x4;
      if (fields >> flags && (flags & kPfExiting) != 0) return false;
    }
  }
  std::ifstream f(dir + "/status");
  constexpr unsigned long long kSigKill = 1ull << (SIGKILL - 1);
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("SigPnd:", 0) == 0 || line.rfind("ShdPnd:", 0) == 0) {
      const unsigned long long pending = std::strtoull(line.c_str() + 7, nullptr, 16);
      if ((pending & kSigKill) != 0) return false;
    }
  }
  return true;
}

}  // namespace

Endpoint::Endpoint(Worker& worker) : worker_(worker), id_(g_next_endpoint_id++) {}

Result<std::unique_ptr<Endpoint>> Endpoint::create(Worker& worker, ucp_ep_params_t& params, const char* what) {
  std::unique_ptr<Endpoint> ep(new Endpoint(worker));
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode =
      worker.peer_failure() == PeerFailure::kUcx ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &Endpoint::on_error;
  params.err_handler.arg = ep.get();
  ucs_status_t st = ucp_ep_create(worker.handle(), &params, &ep->ep_);
  if (st != UCS_OK) {
    ep->closed_ = true;
    return ucx_error(st, what);
  }
  worker.add_heartbeat(ep.get());
  return ep;
}

Result<std::unique_ptr<Endpoint>> Endpoint::connect_address(Worker& worker, std::span<const std::byte> address) {
  if (address.empty()) return invalid_argument("disagg: empty worker address");
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  return create(worker, params, "ucp_ep_create(worker address)");
}

Result<std::unique_ptr<Endpoint>> Endpoint::connect_sockaddr(Worker& worker, const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) return unavailable("disagg: cannot resolve " + host + ": " + gai_strerror(rc));
  sockaddr_storage storage{};
  socklen_t len = static_cast<socklen_t>(found->ai_addrlen);
  std::memcpy(&storage, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&storage);
  params.sockaddr.addrlen = len;
  std::string what = "ucp_ep_create(" + host + ":" + service + ")";
  return create(worker, params, what.c_str());
}

Result<std::unique_ptr<Endpoint>> Endpoint::accept(Worker& worker, ucp_conn_request_h request) {
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
  const bool have_id = ucp_conn_request_query(request, &attr) == UCS_OK;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  auto ep = create(worker, params, "ucp_ep_create(connection request)");
  // The client's instance id (Worker: its UCX client id); 0 when it did not send one (instance ids are never 0).
  if (ep && have_id && attr.client_id != 0) (*ep)->set_peer(attr.client_id);
  return ep;
}

Endpoint::~Endpoint() {
  if (!closed_) {
    mark_failed(unavailable("disagg: endpoint destroyed while open"));
    (void)close(Deadline::after(std::chrono::seconds(1)));
  }
  // A close that did not finish leaves its requests to ucp_worker_destroy; the message buffers must outlive them.
  if (!closed_) {
    if (close_request_ != nullptr) ucp_request_free(close_request_);
    for (Send& s : sends_) {
      if (s.request != nullptr) ucp_request_free(s.request);
      worker_.keep_until_destroyed(std::move(s.bytes));
    }
  }
  worker_.remove_heartbeat(this);
}

void Endpoint::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<Endpoint*>(arg)->mark_failed(ucx_error(status, "endpoint to peer"));
}

void Endpoint::mark_failed(Status reason) {
  if (failure_.is_ok()) failure_ = std::move(reason);
}

size_t Endpoint::reap_sends() {
  size_t outstanding = 0;
  heartbeats_outstanding_ = 0;
  for (auto it = sends_.begin(); it != sends_.end();) {
    ucs_status_t st = UCS_OK;
    if (finished(it->request, &st)) {
      if (st != UCS_OK) mark_failed(ucx_error(st, "ucp_am_send_nbx"));
      it = sends_.erase(it);
      continue;
    }
    ++outstanding;
    if (it->heartbeat) ++heartbeats_outstanding_;
    ++it;
  }
  return outstanding;
}

Status Endpoint::send(std::span<const std::byte> message, MessageKind kind, Deadline deadline) {
  if (closed_ || close_request_ != nullptr) return unavailable("disagg: send on a closed endpoint");
  if (failed()) return failure_;
  FaultPolicy* faults = worker_.faults();
  if (faults != nullptr && faults->drop_message(static_cast<uint16_t>(kind))) return Status::ok();
  Send s{nullptr, {message.begin(), message.end()}, false};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  void* request = ucp_am_send_nbx(ep_, static_cast<unsigned>(kind), nullptr, 0, s.bytes.data(), s.bytes.size(), &param);
  if (UCS_PTR_IS_ERR(request)) {
    Status st = ucx_error(UCS_PTR_STATUS(request), "ucp_am_send_nbx");
    mark_failed(st);
    return st;
  }
  if (request == nullptr) return Status::ok();
  s.request = request;
  sends_.push_back(std::move(s));
  void* mine = request;
  auto done = [&] {
    reap_sends();
    for (const Send& x : sends_) {
      if (x.request == mine) return failed();
    }
    return true;
  };
  Status waited = worker_.wait(done, deadline, "ucp_am_send_nbx");
  if (!waited.is_ok()) mark_failed(waited);
  if (failed()) return failure_;
  return Status::ok();
}

void Endpoint::send_heartbeat() {
  if (closed_ || close_request_ != nullptr || failed()) return;
  reap_sends();
  if (heartbeats_outstanding_ > 0) return;
  Send s{nullptr, encode_heartbeat(worker_.instance()), true};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  void* request = ucp_am_send_nbx(ep_, static_cast<unsigned>(MessageKind::kHeartbeat), nullptr, 0, s.bytes.data(),
                                  s.bytes.size(), &param);
  if (UCS_PTR_IS_ERR(request)) {
    mark_failed(ucx_error(UCS_PTR_STATUS(request), "heartbeat"));
  } else if (request != nullptr) {
    s.request = request;
    sends_.push_back(std::move(s));
  }
}

Result<RemoteKey> Endpoint::unpack_rkey(std::span<const std::byte> packed) {
  if (closed_ || close_request_ != nullptr || failed()) {
    return unavailable("disagg: rkey unpack on a failed or closed endpoint");
  }
  if (worker_.peer_failure() != PeerFailure::kUcx && peer_) {
    // Same host: the peer's segments attached here first, so that they outlive it until this endpoint closes
    // (PeerSegments: the few microseconds between the liveness check below and UCX's own attach).
    if (std::optional<uint32_t> pid = worker_.pid_of(*peer_)) {
      Status pinned = segments_.pin(*pid);
      if (!pinned.is_ok()) {
        return unavailable("disagg: the peer's process (instance " + std::to_string(*peer_) +
                           ") has exited or is exiting: its remote key is not unpacked (" + pinned.message() + ")");
      }
    }
  }
  if (peer_gone()) {
    return unavailable("disagg: the peer's process (instance " + std::to_string(*peer_) +
                       ") has exited or is exiting: its remote key is not unpacked");
  }
  if (FaultPolicy* faults = worker_.faults()) faults->before_rkey_unpack();
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep_, packed.data(), &rkey);
  if (st != UCS_OK) return ucx_error(st, "ucp_ep_rkey_unpack");
  return RemoteKey(rkey);
}

Result<const RemoteKey*> Endpoint::cached_rkey(std::span<const std::byte> packed) {
  for (const CachedKey& c : rkeys_) {
    if (!std::equal(c.packed.begin(), c.packed.end(), packed.begin(), packed.end())) continue;
    if (c.key == nullptr) return c.error;
    return c.key.get();
  }
  if (closed_ || close_request_ != nullptr || failed()) {
    return unavailable("disagg: rkey unpack on a failed or closed endpoint");
  }
  Result<RemoteKey> k = unpack_rkey(packed);
  CachedKey c{{packed.begin(), packed.end()}, nullptr, Status::ok()};
  if (k) {
    c.key = std::make_unique<RemoteKey>(std::move(*k));
  } else {
    c.error = k.error();
  }
  rkeys_.push_back(std::move(c));
  if (rkeys_.back().key == nullptr) return rkeys_.back().error;
  return rkeys_.back().key.get();
}

bool Endpoint::peer_gone() const {
  if (worker_.peer_failure() == PeerFailure::kUcx || !peer_) return false;
  std::optional<uint32_t> pid = worker_.pid_of(*peer_);
  return pid && !process_alive(*pid);
}

Status Endpoint::close(Deadline deadline) {
  if (closed_) return Status::ok();
  worker_.remove_heartbeat(this);
  Status flushed;
  if (close_request_ == nullptr) {
    ucp_request_param_t param{};
    if (worker_.peer_failure() == PeerFailure::kUcx) {
      if (!failed()) {
        void* flush = ucp_ep_flush_nbx(ep_, &param);
        ucs_status_t st = UCS_OK;
        if (UCS_PTR_IS_ERR(flush)) {
          // A status, not a request (an endpoint UCX already failed, e.g. "Endpoint timeout"): nothing to free.
          flushed = ucx_error(UCS_PTR_STATUS(flush), "ucp_ep_flush_nbx before close");
          flush = nullptr;
        } else {
          flushed = worker_.wait([&] { return finished(flush, &st) || failed(); }, deadline, "flush before close");
          if (flushed.is_ok() && st != UCS_OK) flushed = ucx_error(st, "ucp_ep_flush_nbx before close");
          if (flushed.is_ok() && failed()) flushed = failure_;
        }
        if (!flushed.is_ok()) mark_failed(flushed);
        if (flush != nullptr) ucp_request_free(flush);  // completes (cancelled) in the forced close below
      }
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;  // requires UCP_ERR_HANDLING_MODE_PEER on both sides
      deadline = Deadline::after(std::chrono::seconds(5));  // a forced close does not wait for the peer
    }
    void* request = ucp_ep_close_nbx(ep_, &param);
    if (UCS_PTR_IS_ERR(request)) {
      // UCX released the endpoint anyway: nothing of it is left to wait for.
      mark_failed(ucx_error(UCS_PTR_STATUS(request), "ucp_ep_close_nbx"));
      request = nullptr;
    }
    close_request_ = request;
    ep_ = nullptr;
  }
  ucs_status_t st = UCS_OK;
  Status waited = worker_.wait([&] { return finished(close_request_, &st); }, deadline, "closing the endpoint");
  if (!waited.is_ok()) return waited;  // still closing
  closed_ = true;
  reap_sends();  // every request on the endpoint has completed by now
  rkeys_.clear();  // no put through them is left (an unfinished close keeps them for its requests)
  segments_.release();  // after the keys: UCX's own attachments are gone first
  sends_.clear();
  if (flushed.is_ok() && st != UCS_OK && st != UCS_ERR_CANCELED && !failed()) {
    flushed = ucx_error(st, "ucp_ep_close_nbx");
  }
  return flushed;
}

bool Endpoint::peer_may_write() const {
  if (!closed_) return true;
  if (worker_.peer_failure() == PeerFailure::kUcx) return false;
  if (!peer_) return true;
  std::optional<uint32_t> pid = worker_.pid_of(*peer_);
  return !pid || process_running(*pid);
}

std::vector<std::string> Endpoint::transports() const {
  std::vector<std::string> out;
  if (ep_ == nullptr) return out;
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return out;
  ucp_ep_print_info(ep_, f);
  std::fclose(f);
  // Lane lines read "#  lane[0]:  1:posix/memory.0 md[1] ..."; the transport is the word between ':' and '/'.
  std::set<std::string> names;
  for (const char* p = std::strstr(text, "lane["); p != nullptr; p = std::strstr(p + 1, "lane[")) {
    const char* colon = std::strchr(p, ':');
    if (colon == nullptr) break;
    const char* c = colon + 1;
    while (*c == ' ') ++c;
    while (*c >= '0' && *c <= '9') ++c;
    if (*c != ':') continue;
    const char* start = c + 1;
    const char* slash = std::strchr(start, '/');
    const char* eol = std::strchr(start, '\n');
    if (slash != nullptr && (eol == nullptr || slash < eol)) names.emplace(start, slash);
  }
  std::free(text);
  return {names.begin(), names.end()};
}

}  // namespace kestrel::disagg
