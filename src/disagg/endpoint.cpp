#include "disagg/endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "disagg/ucx_status.h"

namespace kestrel::disagg {
namespace {

std::atomic<uint64_t> g_next_endpoint_id{1};

// Frees a finished request; true when it was finished (or there was none).
bool request_done(void* request, ucs_status_t* status) {
  if (request == nullptr) return true;
  ucs_status_t st = ucp_request_check_status(request);
  if (st == UCS_INPROGRESS) return false;
  if (status != nullptr) *status = st;
  ucp_request_free(request);
  return true;
}

}  // namespace

Endpoint::Endpoint(Worker& worker) : worker_(worker), id_(g_next_endpoint_id++) {
  heartbeat_ = encode_heartbeat(worker.instance());
}

Result<std::unique_ptr<Endpoint>> Endpoint::create(Worker& worker, ucp_ep_params_t& params, const char* what) {
  std::unique_ptr<Endpoint> ep(new Endpoint(worker));
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
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
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&storage);
  params.sockaddr.addrlen = len;
  std::string what = "ucp_ep_create(" + host + ":" + service + ")";
  return create(worker, params, what.c_str());
}

Result<std::unique_ptr<Endpoint>> Endpoint::accept(Worker& worker, ucp_conn_request_h request) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  return create(worker, params, "ucp_ep_create(connection request)");
}

Endpoint::~Endpoint() {
  if (!closed_) {
    mark_failed(unavailable("disagg: endpoint destroyed while open"));
    (void)close(Deadline::after(std::chrono::seconds(1)));
  }
  worker_.remove_heartbeat(this);
}

void Endpoint::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<Endpoint*>(arg)->mark_failed(ucx_error(status, "endpoint to peer"));
}

void Endpoint::mark_failed(Status reason) {
  if (failure_.is_ok()) failure_ = std::move(reason);
}

Status Endpoint::wait_request(void*& request, Deadline deadline, const char* what) {
  if (UCS_PTR_IS_ERR(request)) {
    ucs_status_t st = UCS_PTR_STATUS(request);
    request = nullptr;
    return ucx_error(st, what);
  }
  ucs_status_t status = UCS_OK;
  Status waited = worker_.wait(
      [&] {
        if (!request_done(request, &status)) return false;
        request = nullptr;
        return true;
      },
      deadline, what);
  if (!waited.is_ok()) return waited;  // `request` is still outstanding: the caller releases it
  if (status != UCS_OK) return ucx_error(status, what);
  return Status::ok();
}

Status Endpoint::send(std::span<const std::byte> message, MessageKind kind, Deadline deadline) {
  if (closed_) return unavailable("disagg: send on a closed endpoint");
  if (failed()) return failure_;
  FaultPolicy* faults = worker_.faults();
  if (faults != nullptr && faults->drop_message(static_cast<uint16_t>(kind))) return Status::ok();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  void* request = ucp_am_send_nbx(ep_, static_cast<unsigned>(kind), nullptr, 0, message.data(), message.size(), &param);
  Status st = wait_request(request, deadline, "ucp_am_send_nbx");
  if (!st.is_ok()) {
    mark_failed(st);
    // A request still in flight reads `message`: the forced close completes it before the caller frees the buffer.
    if (request != nullptr) {
      (void)close(Deadline::after(std::chrono::seconds(1)));
      ucp_request_free(request);
    }
    return st;
  }
  if (failed()) return failure_;
  return Status::ok();
}

void Endpoint::send_heartbeat() {
  if (closed_ || failed()) return;
  if (!request_done(heartbeat_request_, nullptr)) return;  // at most one outstanding
  heartbeat_request_ = nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  void* request = ucp_am_send_nbx(ep_, static_cast<unsigned>(MessageKind::kHeartbeat), nullptr, 0, heartbeat_.data(),
                                  heartbeat_.size(), &param);
  if (UCS_PTR_IS_ERR(request)) {
    mark_failed(ucx_error(UCS_PTR_STATUS(request), "heartbeat"));
  } else if (request != nullptr) {
    heartbeat_request_ = request;
  }
}

Result<RemoteKey> Endpoint::unpack_rkey(std::span<const std::byte> packed) {
  if (closed_ || failed()) return unavailable("disagg: rkey unpack on a failed or closed endpoint");
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep_, packed.data(), &rkey);
  if (st != UCS_OK) return ucx_error(st, "ucp_ep_rkey_unpack");
  return RemoteKey(rkey);
}

Status Endpoint::close(Deadline deadline) {
  if (closed_) return Status::ok();
  Status flushed;
  void* flush = nullptr;
  if (!failed()) {
    ucp_request_param_t param{};
    flush = ucp_ep_flush_nbx(ep_, &param);
    flushed = wait_request(flush, deadline, "ucp_ep_flush_nbx before close");
    if (!flushed.is_ok()) mark_failed(flushed);
  }
  // Every request on the endpoint completes (cancelled, if need be) during a forced close.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(ep_, &param);
  Status st = wait_request(request, Deadline::after(std::chrono::seconds(5)), "ucp_ep_close_nbx");
  if (flush != nullptr) ucp_request_free(flush);
  if (request != nullptr) {  // still closing: not closed
    ucp_request_free(request);
    return st;
  }
  closed_ = true;
  ep_ = nullptr;
  if (heartbeat_request_ != nullptr) ucp_request_free(heartbeat_request_);
  heartbeat_request_ = nullptr;
  worker_.remove_heartbeat(this);
  return flushed;
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
