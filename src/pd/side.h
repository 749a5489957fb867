// What both sides of a hand-off share: the UCX worker and the one thread that drives it (UCS_THREAD_MODE_SINGLE:
// every UCX call of the side runs there), a task queue other threads post to, and the endpoints to the peer
// instances, keyed by the peer's instance id.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "disagg/endpoint.h"
#include "disagg/listener.h"
#include "disagg/worker.h"

namespace kestrel::pd {

class HandoffSide {
 public:
  virtual ~HandoffSide();
  HandoffSide(const HandoffSide&) = delete;
  HandoffSide& operator=(const HandoffSide&) = delete;

  uint64_t instance() const { return instance_; }
  // The packed UCX worker address a peer connects to (same host: shared memory or tcp; UCX_TLS decides).
  const std::vector<std::byte>& address() const { return address_; }
  // Opens the endpoint to a peer from its address and instance id (waits for the side's thread).
  Status connect(std::span<const std::byte> peer_address, uint64_t peer_instance);
  // Opens the endpoint to a peer's listener (listen(), on a side whose transports include tcp) as a UCX
  // client-server connection; the listening side learns this side's instance id from the connection request.
  Status connect_sockaddr(const std::string& host, uint16_t port, uint64_t peer_instance);
  // The port of this side's listener; 0 when it has none.
  uint16_t listener_port() const { return listener_port_; }
  // The UCX transports of the endpoint to a peer (empty when not connected).
  std::vector<std::string> transports(uint64_t peer_instance);
  // When a message (heartbeats included) from a peer last arrived; nullopt if none has.
  std::optional<disagg::Clock::time_point> last_heard(uint64_t peer_instance);

 protected:
  explicit HandoffSide(const disagg::WorkerOptions& options);
  // Creates the worker on the side's thread, then runs `setup` there; call once from the derived create().
  Status start(std::function<Status()> setup);
  // From `setup`: accept UCX client-server connections on `host` (an IPv4 address, "0.0.0.0" for any) at a free
  // port. Each one becomes the endpoint to the instance that connected, replacing an earlier one (retire()).
  Status listen(const std::string& host);
  // Runs on the side's thread, in order.
  void post(std::function<void()> task);
  template <typename T>
  T call(std::function<T()> f) {
    auto p = std::make_shared<std::promise<T>>();
    auto fut = p->get_future();
    post([p, f = std::move(f)] { p->set_value(f()); });
    return fut.get();
  }
  // Called on the side's thread after every round of progress and tasks.
  virtual void idle() {}
  // Called on the side's thread when it stops, before its endpoints and worker go (regions, held endpoints).
  virtual void teardown() {}
  // A reconnect replaces the endpoint to a peer; the old one goes here (default: closed and destroyed now). A
  // side whose transfers may still refer to it keeps it.
  virtual void retire(std::unique_ptr<disagg::Endpoint> ep) { (void)ep; }
  disagg::Worker& worker() { return *worker_; }
  disagg::Endpoint* endpoint(uint64_t peer);
  // Stops the thread; derived destructors call it first (their members must outlive it).
  void stop();

  std::unordered_map<uint64_t, std::unique_ptr<disagg::Endpoint>> endpoints_;

 private:
  void loop();
  void accept_connections();

  disagg::WorkerOptions options_;
  std::unique_ptr<disagg::Worker> worker_;
  uint64_t instance_ = 0;
  std::vector<std::byte> address_;
  std::unique_ptr<disagg::Listener> listener_;
  std::atomic<uint16_t> listener_port_{0};
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kestrel::pd
