// One key of an online softmax (running max m, running sum l, accumulator o over Dv values): rescales what is
// accumulated when the key's score s is a new maximum, then adds the key's weight times its values v. The one
// definition every attention kernel uses, so they share each operation and its order (and so their bits).
#pragma once

#include <cmath>
#include <cstdint>

namespace kestrel::kernels {

inline void online_softmax_step(float s, float& m, float& l, float* o, const float* v, int64_t Dv) {
  if (s > m) {
    const float r = std::exp(m - s);  // 0 on the first key
    l *= r;
    for (int64_t d = 0; d < Dv; ++d) o[d] *= r;
    m = s;
  }
  const float w = std::exp(s - m);
  l += w;
  for (int64_t d = 0; d < Dv; ++d) o[d] += w * v[d];
}

}  // namespace kestrel::kernels
