// The memory of a decode instance's cache pools, allocated through UCX so that a prefill instance on the same host
// puts into it directly. A decode instance creates DecodeArenas before its scheduler (CachePoolConfig::arenas: the
// pools' arenas come from here) and hands the same object to its DecodeHandoff (DecodeHandoffOptions::arenas),
// whose worker then runs on this UCP context and advertises these regions' remote keys instead of registering the
// pools again.
//
// Why (UCX 1.13, docs/disaggregation.md §2 "UCX 1.13 specifics"): over shared memory a ucp_put_nbx reaches its
// target directly only through posix/sysv, into a segment the target allocated with them; into memory that was
// only registered (ucp_mem_map of an existing buffer) every put is emulated with active messages, copied in 8 KiB
// fragments through the FIFO and out again by the target's progress. Over tcp nothing changes.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cache/arena_source.h"
#include "disagg/context.h"
#include "disagg/memory.h"

namespace kestrel::pd {

class DecodeArenas final : public ArenaSource {
 public:
  // `transports`: as disagg::WorkerOptions::transports (empty: UCX_TLS).
  static Result<std::shared_ptr<DecodeArenas>> create(const std::string& transports = "");

  // A UCX-allocated region (disagg::Region::allocate); the memory lives while the returned pointer or the region
  // (region_of) is held.
  Result<std::shared_ptr<std::byte>> allocate(size_t bytes, const char* what) override;
  // The region that `arena` (as allocated here, whole) belongs to; null if it was not allocated here or is gone.
  std::shared_ptr<disagg::Region> region_of(std::span<const std::byte> arena);
  const std::shared_ptr<disagg::Context>& context() const { return context_; }

 private:
  explicit DecodeArenas(std::shared_ptr<disagg::Context> c) : context_(std::move(c)) {}
  std::shared_ptr<disagg::Context> context_;
  std::mutex mu_;
  std::vector<std::weak_ptr<disagg::Region>> regions_;
};

}  // namespace kestrel::pd
