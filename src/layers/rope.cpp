#include "layers/rope.h"

#include <algorithm>
#include <cmath>

#include "loader/deepseek_config.h"

namespace kestrel {

MlaRope::MlaRope(const MlaRopeConfig& c, int64_t dim) {
  const int64_t half = dim / 2;
  const float base = static_cast<float>(c.theta);
  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq_[static_cast<size_t>(i)] =
        1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
  if (!c.yarn) return;
  // YaRN: blend extrapolated (original) and interpolated (÷ factor) frequencies with a linear ramp
  // over pair indices [low, high]; corr(r) = dim·ln(orig / (2π r)) / (2 ln base).
  auto corr = [&](double rot) {
    return static_cast<double>(dim) * std::log(c.original_max_position_embeddings / (rot * 2.0 * M_PI)) /
           (2.0 * std::log(c.theta));
  };
  const double lo = corr(c.beta_fast), hi = corr(c.beta_slow);
  double low = std::max(c.truncate ? std::floor(lo) : lo, 0.0);
  double high = std::min(c.truncate ? std::ceil(hi) : hi, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no singularity
  const float factor = static_cast<float>(c.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
    const float extrap = 1.0f - ramp;  // weight of the original frequency
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float f_extra = 1.0f / pos_freq, f_inter = 1.0f / (factor * pos_freq);
    inv_freq_[static_cast<size_t>(i)] = f_inter * (1.0f - extrap) + f_extra * extrap;
  }
  // cos/sin magnitude mscale(factor, mscale) / mscale(factor, mscale_all_dim) (1 for DeepSeek V3 /
  // Kimi K2, where both are 1); the softmax scale carries mscale_all_dim² (deepseek_config.cpp).
  mag_ = static_cast<float>(yarn_mscale(c.factor, c.mscale) / yarn_mscale(c.factor, c.mscale_all_dim));
}

void MlaRope::angles(int64_t pos, float* cos, float* sin) const {
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float a = p * inv_freq_[i];
    cos[i] = std::cos(a) * mag_;
    sin[i] = std::sin(a) * mag_;
  }
}

void MlaRope::rotate(float* x, const float* cos, const float* sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos[i] - b * sin[i];
    x[2 * i + 1] = b * cos[i] + a * sin[i];
  }
}

}  // namespace kestrel
