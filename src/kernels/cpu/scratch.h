// Per-thread scratch buffers that only grow: steady-state decode allocates nothing.
// Each kernel uses its own slot so nested use within one thread never aliases.
#pragma once

#include <cstddef>
#include <vector>

namespace kestrel::kernels {

enum ScratchSlot { kScratchLinear = 0, kScratchKdaP, kScratchKdaDecay, kScratchMla, kScratchGgufGemm, kScratchKvRow,
                   kScratchBlasWeights, kScratchBlasPadX, kScratchBlasPadY, kScratchVisionScores, kScratchInt8Gemm,
                   kScratchLinearAcc, kScratchLatentSpan,
                   kScratchSlots };

inline float* thread_scratch(ScratchSlot slot, size_t n) {
  thread_local std::vector<float> bufs[kScratchSlots];
  std::vector<float>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace kestrel::kernels
