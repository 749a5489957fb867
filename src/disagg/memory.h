// Registered memory and remote keys. A Region is memory a peer may write into, with its remote key packed once:
// either allocated by UCX (allocate: the form a peer on the same host writes directly) or an existing buffer
// registered (map). A RemoteKey is a peer's packed key unpacked on the endpoint that will write through it.
//
// Why allocate: in UCX 1.13 a put over shared memory reaches the target's memory directly only through the
// posix/sysv transports, which write into a segment the target allocated with them (UCP_MEM_MAP_ALLOCATE: the
// rkey carries the segment, the writer maps it and copies into it). cma (process_vm_writev) serves rendezvous only,
// never ucp_put_nbx (UCP's RMA lanes need put short/bcopy, cma has zcopy alone), so a put into merely registered
// memory is emulated with active messages: copied through the FIFO in 8 KiB fragments and out again by the
// target's progress. Over tcp both forms are the same (UCX allocates with mmap and registers).
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "base/result.h"
#include "disagg/context.h"

namespace kestrel::disagg {

class Worker;

class Region {
 public:
  // Registers [base, base + length) with the worker's context; the buffer stays the caller's.
  static Result<std::unique_ptr<Region>> map(Worker& worker, void* base, size_t length);
  // Allocates `length` bytes through UCX (UCP_MEM_MAP_ALLOCATE; shared memory when the context has posix or sysv,
  // zero-filled), freed with the Region. The context lives at least as long.
  static Result<std::unique_ptr<Region>> allocate(std::shared_ptr<Context> context, size_t length);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  std::byte* base() const { return base_; }
  size_t length() const { return length_; }
  uint64_t address(size_t offset) const { return reinterpret_cast<uint64_t>(base_ + offset); }
  const std::vector<std::byte>& packed_rkey() const { return packed_rkey_; }
  bool allocated() const { return allocated_; }

 private:
  Region(std::shared_ptr<Context> context, std::byte* base, size_t length)
      : context_(std::move(context)), base_(base), length_(length) {}
  Status pack();
  std::shared_ptr<Context> context_;
  bool allocated_ = false;
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
