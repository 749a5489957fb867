#include "layers/ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/elementwise.h"

namespace kestrel {

using kernels::matmul;

void GatedMlp::bind(Binder& b, const std::string& p, const char* gate, const char* up, const char* down,
                    int64_t in, int64_t inter, const TextConfig& c) {
  c_ = &c;
  wg_ = b.linear(p + gate, inter, in);
  wu_ = b.linear(p + up, inter, in);
  wd_ = b.linear(p + down, in, inter);
}

void GatedMlp::forward(const float* x, int64_t T, float* y) {
  const int64_t n = T * wg_.out;
  g_.resize(static_cast<size_t>(n));
  u_.resize(static_cast<size_t>(n));
  matmul(wg_, x, T, g_.data());
  matmul(wu_, x, T, u_.data());
  if (c_->hidden_act == Activation::kSiTU)
    kernels::situ_glu(g_.data(), u_.data(), n, c_->situ_beta, c_->situ_linear_beta, g_.data());
  else
    kernels::swiglu(g_.data(), u_.data(), n, g_.data());
  matmul(wd_, g_.data(), T, y);
}

Status MoeBlock::bind(Binder& b, const std::string& p, const TextConfig& c, const ExpertNames& names) {
  c_ = &c;
  E_ = c.num_experts;
  K_ = c.num_experts_per_token;
  const int64_t hid = c.hidden_size;
  router_ = b.linear(p + "gate", E_, hid);
  if (c.router_bias) bias_ = b.vec(p + "gate.e_score_correction_bias", {E_});
  in_ = c.latent_moe() ? c.routed_expert_hidden_size : hid;
  if (c.latent_moe()) {
    lat_down_ = b.linear(p + "routed_expert_down_proj", in_, hid);
    lat_up_ = b.linear(p + "routed_expert_up_proj", hid, in_);
    if (c.latent_moe_use_norm) lat_norm_ = b.vec(p + "routed_expert_norm.weight", {in_});
  }
  experts_.resize(static_cast<size_t>(E_));
  for (int64_t e = 0; e < E_ && b.ok(); ++e)
    experts_[static_cast<size_t>(e)].bind(b, p + "experts." + std::to_string(e) + ".", names.gate, names.up, names.down, in_,
                                          c.moe_intermediate_size, c);
  has_shared_ = c.num_shared_experts > 0;
  if (has_shared_)
    shared_.bind(b, p + "shared_experts.", "gate_proj", "up_proj", "down_proj", hid,
                 static_cast<int64_t>(c.num_shared_experts) * c.moe_intermediate_size, c);
  by_expert_.resize(static_cast<size_t>(E_));
  for (auto& v : by_expert_) v.reserve(64);  // decode never grows these
  return b.status();
}

void MoeBlock::route(const float* x, int64_t T, std::vector<int>& ids, std::vector<float>& weights) {
  logits_.resize(static_cast<size_t>(T * E_));
  matmul(router_, x, T, logits_.data());
  ids.resize(static_cast<size_t>(T * K_));
  weights.resize(static_cast<size_t>(T * K_));
  std::vector<int>& order = ids_;
  order.resize(static_cast<size_t>(E_));
  std::vector<float>& sel = sel_;
  sel.resize(static_cast<size_t>(E_));
  score_.resize(static_cast<size_t>(E_));
  const int64_t G = c_->num_expert_group, per_group = E_ / G;
  group_score_.resize(static_cast<size_t>(G));
  group_order_.resize(static_cast<size_t>(G));
  const bool has_bias = !bias_.empty();
  auto by_value = [](const std::vector<float>& v) {
    return [&v](int a, int b) {
      const float sa = v[static_cast<size_t>(a)], sb = v[static_cast<size_t>(b)];
      return sa > sb || (sa == sb && a < b);
    };
  };
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits_.data() + t * E_;
    if (c_->router_scoring == RouterScoring::kSoftmax) {
      const float mx = *std::max_element(l, l + E_);
      float sum = 0;
      for (int64_t e = 0; e < E_; ++e) sum += score_[static_cast<size_t>(e)] = std::exp(l[e] - mx);
      for (int64_t e = 0; e < E_; ++e) score_[static_cast<size_t>(e)] /= sum;
    } else {
      for (int64_t e = 0; e < E_; ++e) score_[static_cast<size_t>(e)] = kernels::sigmoid(l[e]);
    }
    for (int64_t e = 0; e < E_; ++e)
      sel[static_cast<size_t>(e)] = score_[static_cast<size_t>(e)] + (has_bias ? bias_[static_cast<size_t>(e)] : 0.0f);
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        const float* s = sel.data() + g * per_group;
        float a = -INFINITY, b = -INFINITY;  // largest two
        for (int64_t i = 0; i < per_group; ++i) {
          if (s[i] > a) b = a, a = s[i];
          else if (s[i] > b) b = s[i];
        }
        group_score_[static_cast<size_t>(g)] = has_bias ? a + b : a;
      }
      std::iota(group_order_.begin(), group_order_.end(), 0);
      std::partial_sort(group_order_.begin(), group_order_.begin() + c_->topk_group, group_order_.end(),
                        by_value(group_score_));
      for (int64_t i = c_->topk_group; i < G; ++i)
        std::fill_n(sel.begin() + group_order_[static_cast<size_t>(i)] * per_group, per_group, -INFINITY);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K_, order.end(), by_value(sel));
    float sum = 0;
    for (int64_t i = 0; i < K_; ++i) {
      const int e = order[static_cast<size_t>(i)];
      ids[static_cast<size_t>(t * K_ + i)] = e;
      const float s = score_[static_cast<size_t>(e)];
      weights[static_cast<size_t>(t * K_ + i)] = s;
      sum += s;
    }
    for (int64_t i = 0; i < K_; ++i) {
      float& w = weights[static_cast<size_t>(t * K_ + i)];
      if (c_->moe_renormalize) w /= (sum + 1e-20f);
      w *= c_->routed_scaling_factor;
    }
  }
}

void MoeBlock::forward(const float* x, int64_t T, float* out) {
  const int64_t hid = c_->hidden_size;
  std::vector<int>& ids = route_ids_;
  route(x, T, ids, w_);
  const float* in = x;
  if (c_->latent_moe()) {
    z_.resize(static_cast<size_t>(T * in_));
    matmul(lat_down_, x, T, z_.data());
    in = z_.data();
  }
  // Group tokens by expert, run each expert once over its tokens (weights read once).
  for (auto& v : by_expert_) v.clear();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K_; ++i)
      by_expert_[static_cast<size_t>(ids[static_cast<size_t>(t * K_ + i)])].push_back(
          {t, w_[static_cast<size_t>(t * K_ + i)]});
  acc_.assign(static_cast<size_t>(T * in_), 0.0f);
  for (int64_t e = 0; e < E_; ++e) {
    const auto& toks = by_expert_[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    gathered_.resize(static_cast<size_t>(n * in_));
    eout_.resize(static_cast<size_t>(n * in_));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(in + toks[static_cast<size_t>(i)].first * in_, in_, gathered_.data() + i * in_);
    experts_[static_cast<size_t>(e)].forward(gathered_.data(), n, eout_.data());
    for (int64_t i = 0; i < n; ++i) {
      const auto [t, w] = toks[static_cast<size_t>(i)];
      float* dst = acc_.data() + t * in_;
      const float* src = eout_.data() + i * in_;
      for (int64_t d = 0; d < in_; ++d) dst[d] += w * src[d];
    }
  }
  if (c_->latent_moe()) {
    if (c_->latent_moe_use_norm)
      kernels::rms_norm(acc_.data(), lat_norm_.data(), T, in_, c_->rms_norm_eps, acc_.data());
    matmul(lat_up_, acc_.data(), T, out);
  } else {
    std::copy(acc_.begin(), acc_.end(), out);
  }
  if (has_shared_) {
    shared_out_.resize(static_cast<size_t>(T * hid));
    shared_.forward(x, T, shared_out_.data());
    for (int64_t i = 0; i < T * hid; ++i) out[i] += shared_out_[static_cast<size_t>(i)];
  }
}

}  // namespace kestrel
