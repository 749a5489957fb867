// A float buffer for large activations that are written before they are read (the vision tower's per-block
// buffers): uninitialised (no zero-fill pass) and on 2 MiB-aligned memory advised for transparent huge pages
// (madvise MADV_HUGEPAGE; the kernel's default THP mode is often "madvise"), so a 200 MiB buffer takes a few hundred
// page faults instead of ~50,000 and the products and attention walking it miss the TLB less. It only grows.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace kestrel::kernels {

class HugePageBuffer {
 public:
  static constexpr size_t kAlign = size_t{2} << 20;

  // At least n floats; the contents are not kept when it grows.
  void reserve(size_t n) {
    if (n <= capacity_) return;
    const size_t bytes = (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, bytes);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the buffer is still correct
    data_.reset(static_cast<float*>(p));
    capacity_ = bytes / sizeof(float);
  }
  float* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }  // floats

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t capacity_ = 0;
};

}  // namespace kestrel::kernels
