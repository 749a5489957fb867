#include "pd/pd_service.h"

#include <cstdio>

#include "pd/bootstrap.h"
#include "pd/pd_metrics.h"

namespace kestrel::pd {

const char* role_name(Role r) { return r == Role::kPrefill ? "prefill" : "decode"; }

Result<std::unique_ptr<PdService>> PdService::create(Scheduler& scheduler, const PdServiceOptions& options) {
  auto p = std::unique_ptr<PdService>(new PdService(scheduler, options));
  CachePools& pools = scheduler.pools();
  p->fingerprint_ = options.model_fingerprint + "|pd=1|page=" + std::to_string(pools.page_tokens()) +
                    "|kv=" + std::string(kv_cache_dtype_name(pools.kv_dtype())) + "|mla=" + std::to_string(pools.mla_block_bytes()) +
                    "|index=" + std::to_string(pools.index_block_bytes()) + "|slot=" + std::to_string(pools.slot_bytes());
  if (options.role == Role::kPrefill) {
    auto s = PrefillHandoff::create(scheduler, options.prefill);
    if (!s) return s.error();
    p->prefill_ = std::move(*s);
  } else {
    auto s = DecodeHandoff::create(scheduler, options.decode);
    if (!s) return s.error();
    p->decode_ = std::move(*s);
    if (options.handoff_failure == HandoffFailure::kRecompute) p->recompute_ = std::make_unique<Recompute>(scheduler);
  }
  return p;
}

PdService::~PdService() {
  recompute_.reset();  // first: a hand-off failed while the sides go down reaches its client as an error
  prefill_.reset();
  decode_.reset();
}

Result<uint64_t> PdService::submit(GenerationRequest req) {
  if (!req.bootstrap.present)
    return invalid_argument(std::string("this is a ") + role_name(opts_.role) +
                            " instance: requests come through a PD router (bootstrap_host, bootstrap_port and "
                            "bootstrap_room are missing)");
  const uint64_t room = req.bootstrap.room;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!rooms_.insert(room).second)
      return invalid_argument("bootstrap_room " + std::to_string(room) + " is already in use (n > 1 is not supported "
                              "with disaggregation)");
  }
  auto user = std::move(req.on_event);
  req.on_event = [this, room, user](const GenerationEvent& ev) {
    if (ev.finish != FinishReason::kNone) {
      std::lock_guard<std::mutex> lk(mu_);
      rooms_.erase(room);
    }
    if (user) user(ev);
  };
  Result<uint64_t> id = unavailable("no hand-off side");
  if (opts_.role == Role::kPrefill) {
    id = prefill_->submit(std::move(req), room);
  } else {
    auto peer = prefill_at(req.bootstrap.host, req.bootstrap.port);
    if (!peer) {
      // A prefill that cannot be reached (not a refused handshake: that is a configuration error).
      const bool here = recompute_ && peer.error().code() == StatusCode::kUnavailable;
      id = here ? recompute_->run_here(std::move(req), peer.error()) : Result<uint64_t>(peer.error());
    } else {
      std::shared_ptr<Recompute::Ticket> ticket = recompute_ ? recompute_->watch(req) : nullptr;
      id = decode_->submit(std::move(req), room, *peer);
      if (id && ticket) recompute_->submitted(ticket, *id);
    }
  }
  if (!id) {
    std::lock_guard<std::mutex> lk(mu_);
    rooms_.erase(room);
  }
  return id;
}

std::string PdService::extra_metrics() const {
  if (prefill_) return prefill_metrics_text(prefill_->counts());
  std::string text = decode_metrics_text(decode_->counts());
  if (recompute_) text += recompute_metrics_text(recompute_->counts());
  return text;
}

// The scheduler's cancel first: a parked or reserved request that its hand-off side releases then ends as
// cancelled. On the decode side the hand-off also tells the prefill (pd/decode_handoff.h).
void PdService::cancel(uint64_t id) {
  sched_.cancel(id);
  if (prefill_) prefill_->cancel(id);
  if (decode_) decode_->cancel(id);
  if (recompute_) recompute_->cancel(id);
}

void PdService::abandon() {
  if (decode_) decode_->abandon();
}

Result<uint64_t> PdService::prefill_at(const std::string& host, int port) {
  const std::string key = host + ":" + std::to_string(port);
  std::lock_guard<std::mutex> one(handshake_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = prefills_.find(key);
    if (it != prefills_.end() && decode_->connected(it->second)) return it->second;
  }
  Hello mine{fingerprint_, decode_->instance(), decode_->address()};
  auto theirs = post_handshake(host, port, mine, opts_.handshake_timeout);
  if (!theirs) return theirs.error();
  if (theirs->fingerprint != fingerprint_)
    return invalid_argument("prefill " + key + " serves another model or cache layout (fingerprint " +
                            theirs->fingerprint + ", this decode instance: " + fingerprint_ + ")");
  // A prefill with a UCX listener (tcp) is connected to there, at the bootstrap host; else by worker address.
  Status st = theirs->port != 0 ? decode_->connect_sockaddr(host, theirs->port, theirs->instance)
                                : decode_->connect(theirs->address, theirs->instance);
  if (!st.is_ok()) return unavailable("connecting to prefill " + key + ": " + st.message());
  std::fprintf(stderr, "kestrel serve: decode: connected to prefill %s (instance %llu)\n", key.c_str(),
               static_cast<unsigned long long>(theirs->instance));
  std::lock_guard<std::mutex> lk(mu_);
  prefills_[key] = theirs->instance;
  return theirs->instance;
}

void PdService::add_routes(server::Router& router) {
  if (opts_.role != Role::kPrefill) return;
  router.add("POST", kHandshakePath, [this](const server::HttpRequest& q, std::shared_ptr<server::HttpExchange> ex) {
    handshake(q, ex);
  });
}

void PdService::handshake(const server::HttpRequest& req, const std::shared_ptr<server::HttpExchange>& ex) {
  auto theirs = decode_hello(req.body);
  if (!theirs) return ex->respond(server::json_error_response(400, theirs.error().message(), "invalid_request_error"));
  if (theirs->fingerprint != fingerprint_) {
    std::fprintf(stderr, "kestrel serve: prefill: refused a decode instance with fingerprint %s (this one: %s)\n",
                 theirs->fingerprint.c_str(), fingerprint_.c_str());
    return ex->respond(server::json_error_response(
        409, "fingerprint mismatch: this prefill instance serves " + fingerprint_ + ", the decode instance " +
                 theirs->fingerprint, "invalid_request_error", "fingerprint_mismatch"));
  }
  // With a listener the decode instance connects to it (its connection request names its instance); otherwise
  // this side connects to the decode's worker address before answering.
  const uint16_t port = prefill_->listener_port();
  if (port == 0) {
    Status st = prefill_->connect(theirs->address, theirs->instance);
    if (!st.is_ok())
      return ex->respond(server::json_error_response(503, "connecting back: " + st.message(), "server_error"));
  }
  std::fprintf(stderr, "kestrel serve: prefill: decode instance %llu %s\n",
               static_cast<unsigned long long>(theirs->instance),
               port == 0 ? "connected" : "connects to the hand-off listener");
  server::HttpResponse r;
  r.body = encode_hello({fingerprint_, prefill_->instance(), prefill_->address(), port});
  ex->respond(std::move(r));
}

}  // namespace kestrel::pd
