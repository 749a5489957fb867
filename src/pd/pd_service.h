// The engine service of a prefill or a decode instance (`kestrel serve --role prefill|decode`): the scheduler
// behind the HTTP API, with every generation request paired by the PD router's bootstrap fields
// (GenerationRequest::bootstrap) and handed off:
//   prefill: the request runs to its first token and its state goes to the decode instance that asks for the
//            same room (PrefillHandoff); the response carries that one token.
//   decode:  before the first request from a prefill, the bootstrap handshake (bootstrap.h) with it; then the
//            request waits for its state (DecodeHandoff) and generates the rest.
// A request without bootstrap fields, a room already in use, or a handshake refused (fingerprint mismatch) is
// rejected with a clear error. A decode instance can run a request whose hand-off failed itself
// (PdServiceOptions::handoff_failure). Destroy this before the scheduler.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "pd/decode_handoff.h"
#include "pd/prefill_handoff.h"
#include "pd/recompute.h"
#include "server/http_server.h"

namespace kestrel::pd {

enum class Role { kPrefill, kDecode };
const char* role_name(Role r);

struct PdServiceOptions {
  Role role = Role::kPrefill;
  // Everything that must be equal on both sides for a hand-off to be exact (model identity, kernels mode);
  // the cache layout (page size, cache dtype, block and slot bytes) is added here.
  std::string model_fingerprint;
  PrefillHandoffOptions prefill;
  DecodeHandoffOptions decode;
  std::chrono::milliseconds handshake_timeout{5000};
  // Decode: a request whose hand-off failed, or whose prefill cannot be reached, ends with the error (kFail) or
  // runs here from its prompt (kRecompute, pd/recompute.h). A fingerprint mismatch is an error either way.
  HandoffFailure handoff_failure = HandoffFailure::kFail;
};

class PdService final : public EngineService {
 public:
  static Result<std::unique_ptr<PdService>> create(Scheduler& scheduler, const PdServiceOptions& options);
  ~PdService() override;

  Result<uint64_t> submit(GenerationRequest req) override;
  void cancel(uint64_t id) override;
  // After Scheduler::drain (a server stopping): the hand-offs its scheduler left unfinished are called off, so the
  // other side releases them now (decode: kCancel to each prefill still holding one of its requests).
  void abandon();
  ServiceStats stats() const override { return sched_.stats(); }
  bool ready() const override { return sched_.ready(); }
  int max_context() const override { return sched_.max_context(); }
  void flush_prefix_cache() override { sched_.flush_prefix_cache(); }
  // The hand-off metrics of this role (pd_metrics.h).
  std::string extra_metrics() const override;

  // Prefill: the bootstrap handshake route, on the HTTP router that listens on the bootstrap port.
  void add_routes(server::Router& router);
  const std::string& fingerprint() const { return fingerprint_; }
  Role role() const { return opts_.role; }

 private:
  PdService(Scheduler& s, const PdServiceOptions& o) : sched_(s), opts_(o) {}
  void handshake(const server::HttpRequest& req, const std::shared_ptr<server::HttpExchange>& ex);
  // Decode: the prefill instance behind a bootstrap address, after a handshake when there is no open connection.
  Result<uint64_t> prefill_at(const std::string& host, int port);

  Scheduler& sched_;
  PdServiceOptions opts_;
  std::string fingerprint_;
  std::unique_ptr<PrefillHandoff> prefill_;
  std::unique_ptr<DecodeHandoff> decode_;
  std::unique_ptr<Recompute> recompute_;  // decode under kRecompute
  std::mutex mu_;
  std::map<std::string, uint64_t> prefills_;  // "host:port" → instance
  std::mutex handshake_mu_;                   // one handshake at a time
  std::set<uint64_t> rooms_;                  // rooms of requests in flight
};

}  // namespace kestrel::pd
