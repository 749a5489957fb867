#include "disagg/listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "disagg/ucx_status.h"

namespace kestrel::disagg {

Result<std::unique_ptr<Listener>> Listener::create(Worker& worker, const std::string& host, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return invalid_argument("disagg: listener address '" + host + "' is not an IPv4 address");
  }
  std::unique_ptr<Listener> l(new Listener(worker));
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = sizeof addr;
  params.conn_handler.cb = &Listener::on_connection;
  params.conn_handler.arg = l.get();
  ucs_status_t st = ucp_listener_create(worker.handle(), &params, &l->listener_);
  if (st != UCS_OK) return ucx_error(st, "ucp_listener_create(" + host + ":" + std::to_string(port) + ")");
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(l->listener_, &attr);
  if (st != UCS_OK) return ucx_error(st, "ucp_listener_query");
  l->port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  return l;
}

Listener::~Listener() {
  for (ucp_conn_request_h r : pending_) (void)ucp_listener_reject(listener_, r);
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
}

void Listener::on_connection(ucp_conn_request_h request, void* arg) {
  static_cast<Listener*>(arg)->pending_.push_back(request);
}

Result<std::unique_ptr<Endpoint>> Listener::accept(Deadline deadline) {
  Status waited = worker_.wait([&] { return !pending_.empty(); }, deadline, "waiting for a connection");
  if (!waited.is_ok()) return waited;
  ucp_conn_request_h request = pending_.front();
  pending_.pop_front();
  return Endpoint::accept(worker_, request);
}

}  // namespace kestrel::disagg
