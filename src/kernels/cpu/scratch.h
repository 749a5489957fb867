// Per-thread scratch buffers that only grow: steady-state decode allocates nothing.
// Each kernel uses its own slot so nested use within one thread never aliases.
#pragma once

#include <cstddef>
#include <vector>

namespace kestrel::kernels {

enum ScratchSlot { kScratchLinear = 0, kScratchKdaP, kScratchKdaDecay, kScratchMla, kScratchGgufGemm, kScratchKvRow,
                   kScratchBlasWeights, kScratchBlasPadX, kScratchBlasPadY, kScratchVisionScores, kScratchInt8Gemm,
                   kScratchLinearAcc, kScratchLatentSpan, kScratchGqaRows, kScratchGqaQ, kScratchGqaOut,
                   kScratchSlots };

// A per-thread vector of at least n elements that only grows, one for each (T, Tag): per-call tables of a kernel's
// work split (steady decode allocates nothing). Tag is any type naming the use.
template <class T, class Tag>
std::vector<T>& thread_table(size_t n) {
  thread_local std::vector<T> v;
  if (v.size() < n) v.resize(n);
  return v;
}

inline float* thread_scratch(ScratchSlot slot, size_t n) {
  thread_local std::vector<float> bufs[kScratchSlots];
  std::vector<float>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace kestrel::kernels
