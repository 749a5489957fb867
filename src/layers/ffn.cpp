#include "layers/ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/elementwise.h"

namespace kestrel {

using kernels::matmul;
using kernels::MatmulTask;

void GatedMlp::bind(Binder& b, const std::string& p, const char* gate, const char* up, const char* down,
                    int64_t in, int64_t inter, const TextConfig& c) {
  c_ = &c;
  wg_ = b.linear(p + gate, inter, in);
  wu_ = b.linear(p + up, inter, in);
  wd_ = b.linear(p + down, in, inter);
}

void GatedMlp::gate_up_tasks(const float* x, int64_t T, float* g, float* u, std::vector<MatmulTask>& out) const {
  out.push_back({&wg_, x, T, g});
  out.push_back({&wu_, x, T, u});
}

void GatedMlp::activate(float* g, const float* u, int64_t n) const {
  if (c_->hidden_act == Activation::kSiTU)
    kernels::situ_glu(g, u, n, c_->situ_beta, c_->situ_linear_beta, g);
  else
    kernels::swiglu(g, u, n, g);
}

void GatedMlp::forward(const float* x, int64_t T, float* y) {
  const int64_t n = T * wg_.out;
  g_.resize(static_cast<size_t>(n));
  u_.resize(static_cast<size_t>(n));
  tasks_.clear();
  gate_up_tasks(x, T, g_.data(), u_.data(), tasks_);
  kernels::matmul_many(tasks_);
  activate(g_.data(), u_.data(), n);
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
  select(T, ids, weights);
}

void MoeBlock::select(int64_t T, std::vector<int>& ids, std::vector<float>& weights) {
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

// Grouped execution: four parallel regions per layer whatever the number of experts hit —
// (router, latent down), (gate/up of every routed expert over its tokens + the shared experts'),
// (every down projection), (latent up). Each expert's weights are read once per call.
void MoeBlock::forward(const float* x, int64_t T, float* out) {
  const int64_t hid = c_->hidden_size, inter = c_->moe_intermediate_size;
  logits_.resize(static_cast<size_t>(T * E_));
  const float* in = x;
  tasks_.clear();
  tasks_.push_back({&router_, x, T, logits_.data()});
  if (c_->latent_moe()) {
    z_.resize(static_cast<size_t>(T * in_));
    tasks_.push_back({&lat_down_, x, T, z_.data()});
    in = z_.data();
  }
  kernels::matmul_many(tasks_);
  std::vector<int>& ids = route_ids_;
  select(T, ids, w_);

  // Tokens of each expert, experts in ascending order; rows of expert e live at [off_e, off_e + n_e).
  for (auto& v : by_expert_) v.clear();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K_; ++i)
      by_expert_[static_cast<size_t>(ids[static_cast<size_t>(t * K_ + i)])].push_back(
          {t, w_[static_cast<size_t>(t * K_ + i)]});
  const int64_t rows = T * K_;
  gathered_.resize(static_cast<size_t>(rows * in_));
  g_.resize(static_cast<size_t>(rows * inter));
  u_.resize(static_cast<size_t>(rows * inter));
  eout_.resize(static_cast<size_t>(rows * in_));
  const int64_t sh_inter = has_shared_ ? static_cast<int64_t>(c_->num_shared_experts) * inter : 0;
  if (has_shared_) {
    sg_.resize(static_cast<size_t>(T * sh_inter));
    su_.resize(static_cast<size_t>(T * sh_inter));
    shared_out_.resize(static_cast<size_t>(T * hid));
  }
  tasks_.clear();
  down_.clear();
  int64_t off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& toks = by_expert_[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(in + toks[static_cast<size_t>(i)].first * in_, in_, gathered_.data() + (off + i) * in_);
    const GatedMlp& ex = experts_[static_cast<size_t>(e)];
    ex.gate_up_tasks(gathered_.data() + off * in_, n, g_.data() + off * inter, u_.data() + off * inter, tasks_);
    down_.push_back(ex.down_task(g_.data() + off * inter, n, eout_.data() + off * in_));
    off += n;
  }
  if (has_shared_) {
    shared_.gate_up_tasks(x, T, sg_.data(), su_.data(), tasks_);
    down_.push_back(shared_.down_task(sg_.data(), T, shared_out_.data()));
  }
  kernels::matmul_many(tasks_);
  if (off > 0) experts_[0].activate(g_.data(), u_.data(), off * inter);
  if (has_shared_) shared_.activate(sg_.data(), su_.data(), T * sh_inter);
  kernels::matmul_many(down_);

  // Weighted sum per token, experts in ascending order (the order does not depend on the batch).
  acc_.assign(static_cast<size_t>(T * in_), 0.0f);
  off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& toks = by_expert_[static_cast<size_t>(e)];
    for (size_t i = 0; i < toks.size(); ++i, ++off) {
      const auto [t, w] = toks[i];
      float* dst = acc_.data() + t * in_;
      const float* src = eout_.data() + off * in_;
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
  if (has_shared_)
    for (int64_t i = 0; i < T * hid; ++i) out[i] += shared_out_[static_cast<size_t>(i)];
}

}  // namespace kestrel
