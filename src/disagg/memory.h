// Registered memory and remote keys. A Region registers an existing buffer (a cache pool) with a worker's UCP
// context once, for the life of the pool, and packs its remote key once; a RemoteKey is a peer's packed key
// unpacked on the endpoint that will write through it.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "base/result.h"

namespace kestrel::disagg {

class Worker;

class Region {
 public:
  static Result<std::unique_ptr<Region>> map(Worker& worker, void* base, size_t length);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  std::byte* base() const { return base_; }
  size_t length() const { return length_; }
  uint64_t address(size_t offset) const { return reinterpret_cast<uint64_t>(base_ + offset); }
  const std::vector<std::byte>& packed_rkey() const { return packed_rkey_; }

 private:
  Region(ucp_context_h context, std::byte* base, size_t length) : context_(context), base_(base), length_(length) {}
  ucp_context_h context_;
  std::byte* base_;
  size_t length_;
  ucp_mem_h memh_ = nullptr;
  std::vector<std::byte> packed_rkey_;
};

class RemoteKey {
 public:
  RemoteKey() = default;
  explicit RemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  RemoteKey(RemoteKey&& o) noexcept : rkey_(o.rkey_) { o.rkey_ = nullptr; }
  RemoteKey& operator=(RemoteKey&& o) noexcept {
    std::swap(rkey_, o.rkey_);
    return *this;
  }
  ~RemoteKey() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
  }
  ucp_rkey_h handle() const { return rkey_; }

 private:
  ucp_rkey_h rkey_ = nullptr;
};

}  // namespace kestrel::disagg
