#include "disagg/worker.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <thread>

#include "disagg/endpoint.h"
#include "disagg/ucx_status.h"

namespace kestrel::disagg {
namespace {

// True when every entry of a UCX_TLS-style list names a shared-memory transport (or the loopback "self").
bool shared_memory_only(const std::string& tls) {
  if (tls.empty() || tls[0] == '^') return false;  // empty: UCX's default, all transports; '^': an exclusion list
  size_t start = 0;
  while (start <= tls.size()) {
    size_t end = tls.find(',', start);
    if (end == std::string::npos) end = tls.size();
    std::string t = tls.substr(start, end - start);
    if (t != "shm" && t != "sm" && t != "posix" && t != "sysv" && t != "cma" && t != "xpmem" && t != "knem" &&
        t != "self") {
      return false;
    }
    start = end + 1;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<Worker>> Worker::create(const WorkerOptions& options) {
  std::unique_ptr<Worker> w(new Worker(options));
  if (w->options_.instance == 0) {
    std::random_device rd;
    while (w->options_.instance == 0) w->options_.instance = (uint64_t{rd()} << 32) | rd();
  }
  if (options.context != nullptr) {
    w->context_ = options.context;
  } else {
    auto c = Context::create(options.transports);
    if (!c) return c.error();
    w->context_ = std::move(*c);
  }
  if (w->options_.peer_failure == PeerFailure::kAuto) {
    w->options_.peer_failure =
        shared_memory_only(w->context_->transports()) ? PeerFailure::kHeartbeat : PeerFailure::kUcx;
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  // Sent with every client-server connection request of this worker (Endpoint::connect_sockaddr), so that the
  // listening side knows the connecting instance before any message (Endpoint::accept).
  wp.client_id = w->options_.instance;
  ucs_status_t st = ucp_worker_create(w->context_->handle(), &wp, &w->worker_);
  if (st != UCS_OK) return ucx_error(st, "ucp_worker_create");

  for (uint16_t kind = 1; kind <= kMaxMessageKind; ++kind) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = kind;
    hp.cb = &Worker::on_message;
    hp.arg = w.get();
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(w->worker_, &hp);
    if (st != UCS_OK) return ucx_error(st, "ucp_worker_set_am_recv_handler");
  }
  return w;
}

Worker::~Worker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
}

Result<std::vector<std::byte>> Worker::address() const {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) return ucx_error(st, "ucp_worker_get_address");
  const auto* p = reinterpret_cast<const std::byte*>(addr);
  std::vector<std::byte> out(p, p + len);
  ucp_worker_release_address(worker_, addr);
  return out;
}

// Called from inside ucp_worker_progress. Messages are sent eagerly and small, so UCX hands over the whole
// message here (UCP_AM_FLAG_WHOLE_MSG); it is copied into the inbox and UCX keeps its buffer.
ucs_status_t Worker::on_message(void* arg, const void*, size_t, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Worker*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {  // never sent by this transport
    ++self->malformed_;
    return UCS_OK;
  }
  std::span<const std::byte> bytes(static_cast<const std::byte*>(data), length);
  std::span<const std::byte> body;
  Result<MessageHeader> h = decode_header(bytes, &body);
  if (!h) {
    ++self->malformed_;
    return UCS_OK;
  }
  self->heard_[h->sender] = {Clock::now(), h->pid};
  if (h->kind == MessageKind::kHeartbeat) return UCS_OK;
  if ((h->kind == MessageKind::kSegment || h->kind == MessageKind::kCompletion || h->kind == MessageKind::kQueued) &&
      self->ended_.count(h->transfer_id) != 0) {
    ++self->expired_;
    return UCS_OK;
  }
  if (self->inbox_.size() >= kMaxQueued) {
    ++self->overflowed_;
    self->inbox_.pop_front();
  }
  self->inbox_.push_back({*h, {body.begin(), body.end()}, Clock::now()});
  if (self->arrival_hooks_.count(static_cast<uint16_t>(h->kind)) != 0) self->arrived_.push_back(self->inbox_.back());
  return UCS_OK;
}

bool Worker::progress() {
  bool events = false;
  if (options_.faults == nullptr || !options_.faults->stall_progress()) events = ucp_worker_progress(worker_) != 0;
  if (events) last_event_ = Clock::now();
  // Outside UCX's callback: a hook may call into UCX (rkey unpacking). A hook that progresses adds to a fresh list.
  if (!arrived_.empty()) {
    std::vector<Message> arrived = std::move(arrived_);
    arrived_.clear();
    for (const Message& m : arrived) {
      auto hook = arrival_hooks_.find(static_cast<uint16_t>(m.header.kind));
      if (hook != arrival_hooks_.end()) hook->second(m);
    }
  }
  send_due_heartbeats();
  // The inbox is in arrival order: expired messages are at its front.
  Clock::time_point oldest = Clock::now() - options_.message_ttl;
  while (!inbox_.empty() && inbox_.front().arrived < oldest) {
    inbox_.pop_front();
    ++expired_;
  }
  if (!ended_.empty()) std::erase_if(ended_, [&](const auto& e) { return e.second < oldest; });
  return events;
}

void Worker::send_due_heartbeats() {
  if (options_.heartbeat_interval.count() <= 0 || heartbeats_.empty()) return;
  if (options_.faults != nullptr && options_.faults->stall_progress()) return;  // a frozen process sends nothing
  Clock::time_point now = Clock::now();
  if (now < next_heartbeat_) return;
  next_heartbeat_ = now + options_.heartbeat_interval;
  for (Endpoint* ep : heartbeats_) ep->send_heartbeat();
}

Status Worker::wait(const std::function<bool()>& done, Deadline deadline, std::string_view what) {
  while (!done()) {
    if (deadline.expired()) return unavailable("disagg: " + std::string(what) + ": deadline passed");
    if (!progress()) idle();
  }
  return Status::ok();
}

void Worker::idle(std::chrono::microseconds sleep) {
  if (Clock::now() - last_event_ < kBusyWindow) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(sleep);
  }
}

void Worker::on_arrival(MessageKind kind, std::function<void(const Message&)> hook) {
  if (hook) {
    arrival_hooks_[static_cast<uint16_t>(kind)] = std::move(hook);
  } else {
    arrival_hooks_.erase(static_cast<uint16_t>(kind));
  }
}

std::optional<Message> Worker::take(MessageKind kind, uint64_t transfer_id, std::optional<uint64_t> sender) {
  auto it = std::find_if(inbox_.begin(), inbox_.end(), [&](const Message& m) {
    return m.header.kind == kind && (transfer_id == 0 || m.header.transfer_id == transfer_id) &&
           (!sender || m.header.sender == *sender);
  });
  if (it == inbox_.end()) return std::nullopt;
  Message m = std::move(*it);
  inbox_.erase(it);
  return m;
}

void Worker::discard(uint64_t transfer_id) {
  std::erase_if(inbox_, [&](const Message& m) { return m.header.transfer_id == transfer_id; });
  ended_[transfer_id] = Clock::now();
}

std::optional<Clock::time_point> Worker::last_heard(uint64_t instance) const {
  auto it = heard_.find(instance);
  if (it == heard_.end()) return std::nullopt;
  return it->second.at;
}

std::optional<uint32_t> Worker::pid_of(uint64_t instance) const {
  auto it = heard_.find(instance);
  if (it == heard_.end()) return std::nullopt;
  return it->second.pid;
}

void Worker::add_heartbeat(Endpoint* ep) { heartbeats_.push_back(ep); }

void Worker::remove_heartbeat(Endpoint* ep) { std::erase(heartbeats_, ep); }

}  // namespace kestrel::disagg
