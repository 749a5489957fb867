// Context: one UCP context (features RMA and active messages; transports from UCX_TLS or a given list), shared by
// the Worker that drives it and by the memory allocated through it (Region::allocate). Memory that a peer writes
// into is allocated before the worker exists (the cache pools of a decode instance are created before its hand-off
// side) and freed after it is gone (the pools outlive the hand-off), so the context lives as long as either holds
// it. Not thread-safe: its users take turns (allocation at start-up, the worker's thread, release at shutdown).
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "base/result.h"

namespace kestrel::disagg {

class Context {
 public:
  // `transports`: a UCX_TLS-style list; empty: UCX_TLS from the environment (UCX's default when unset).
  static Result<std::shared_ptr<Context>> create(const std::string& transports = "");
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return context_; }
  // The transport list this context was created with (the given one, else UCX_TLS, else empty).
  const std::string& transports() const { return transports_; }

 private:
  Context() = default;
  ucp_context_h context_ = nullptr;
  std::string transports_;
};

}  // namespace kestrel::disagg
