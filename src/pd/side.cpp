#include "pd/side.h"

#include <chrono>
#include <cstdio>
#include <optional>

namespace kestrel::pd {

HandoffSide::HandoffSide(const disagg::WorkerOptions& options) : options_(options) {}

HandoffSide::~HandoffSide() { stop(); }

Status HandoffSide::start(std::function<Status()> setup) {
  std::promise<Status> started;
  auto fut = started.get_future();
  thread_ = std::thread([this, &started, setup = std::move(setup)] {
    auto w = disagg::Worker::create(options_);
    if (!w) {
      started.set_value(w.error());
      return;
    }
    worker_ = std::move(*w);
    instance_ = worker_->instance();
    auto a = worker_->address();
    if (!a) {
      started.set_value(a.error());
      return;
    }
    address_ = std::move(*a);
    Status s = setup();
    const bool ok = s.is_ok();
    started.set_value(std::move(s));
    if (ok) loop();
  });
  Status s = fut.get();
  if (!s.is_ok()) {
    thread_.join();
    thread_ = std::thread();
  }
  return s;
}

void HandoffSide::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void HandoffSide::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lk(mu_);
  tasks_.push_back(std::move(task));
}

void HandoffSide::loop() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) break;
      tasks.swap(tasks_);
    }
    const bool busy = worker_->progress();
    accept_connections();
    for (auto& t : tasks) t();
    idle();
    if (!busy && tasks.empty()) worker_->idle(std::chrono::microseconds(200));
  }
  teardown();
  // Endpoints close (bounded) before the worker goes.
  for (auto& [peer, ep] : endpoints_) (void)ep->close(disagg::Deadline::after(std::chrono::milliseconds(1000)));
  endpoints_.clear();
  listener_.reset();
  worker_.reset();
}

Status HandoffSide::listen(const std::string& host) {
  auto l = disagg::Listener::create(*worker_, host, 0);
  if (!l) return l.error();
  listener_ = std::move(*l);
  listener_port_ = listener_->port();
  return Status();
}

void HandoffSide::accept_connections() {
  while (listener_ != nullptr && listener_->pending()) {
    auto ep = listener_->accept(disagg::Deadline::after(std::chrono::milliseconds(0)));
    if (!ep) {
      std::fprintf(stderr, "kestrel: hand-off: accepting a connection failed: %s\n", ep.error().message().c_str());
      continue;
    }
    std::optional<uint64_t> peer = (*ep)->peer();
    if (!peer) {  // not a Kestrel instance (no client id): nothing could be paired with it
      (void)(*ep)->close(disagg::Deadline::after(std::chrono::milliseconds(100)));
      continue;
    }
    if (auto old = endpoints_.find(*peer); old != endpoints_.end()) retire(std::move(old->second));
    endpoints_[*peer] = std::move(*ep);
  }
}

Status HandoffSide::connect_sockaddr(const std::string& host, uint16_t port, uint64_t peer_instance) {
  return call<Status>([this, host, port, peer_instance]() -> Status {
    auto ep = disagg::Endpoint::connect_sockaddr(*worker_, host, port);
    if (!ep) return ep.error();
    (*ep)->set_peer(peer_instance);
    if (auto old = endpoints_.find(peer_instance); old != endpoints_.end()) retire(std::move(old->second));
    endpoints_[peer_instance] = std::move(*ep);
    return Status();
  });
}

Status HandoffSide::connect(std::span<const std::byte> peer_address, uint64_t peer_instance) {
  std::vector<std::byte> addr(peer_address.begin(), peer_address.end());
  return call<Status>([this, addr = std::move(addr), peer_instance]() -> Status {
    auto ep = disagg::Endpoint::connect_address(*worker_, addr);
    if (!ep) return ep.error();
    (*ep)->set_peer(peer_instance);
    if (auto old = endpoints_.find(peer_instance); old != endpoints_.end()) retire(std::move(old->second));
    endpoints_[peer_instance] = std::move(*ep);
    return Status();
  });
}

std::vector<std::string> HandoffSide::transports(uint64_t peer_instance) {
  return call<std::vector<std::string>>([this, peer_instance] {
    disagg::Endpoint* ep = endpoint(peer_instance);
    return ep == nullptr ? std::vector<std::string>{} : ep->transports();
  });
}

std::optional<disagg::Clock::time_point> HandoffSide::last_heard(uint64_t peer_instance) {
  return call<std::optional<disagg::Clock::time_point>>(
      [this, peer_instance] { return worker_->last_heard(peer_instance); });
}

disagg::Endpoint* HandoffSide::endpoint(uint64_t peer) {
  auto it = endpoints_.find(peer);
  return it == endpoints_.end() ? nullptr : it->second.get();
}

}  // namespace kestrel::pd
