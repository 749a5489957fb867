#include "layers/kda_layer.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/kda.h"
#include "kernels/cpu/parallel.h"
#include "layers/shared_temps.h"

namespace kestrel {

using kernels::matmul;

int64_t KdaState::conv_floats(const TextConfig& c) {
  return 3 * (c.linear_attn.short_conv_kernel_size - 1) * static_cast<int64_t>(c.kda_proj_size());
}
int64_t KdaState::recurrent_floats(const TextConfig& c) {
  const int64_t D = c.linear_attn.head_dim;
  return static_cast<int64_t>(c.linear_attn.num_heads) * D * D;
}
void KdaState::zero(const TextConfig& c) const {
  std::fill_n(conv, conv_floats(c), 0.0f);
  std::fill_n(recurrent, recurrent_floats(c), 0.0f);
}

Status KdaLayer::bind(Binder& b, const std::string& p, const TextConfig& c) {
  c_ = &c;
  H_ = c.linear_attn.num_heads;
  D_ = c.linear_attn.head_dim;
  P_ = H_ * D_;
  W_ = c.linear_attn.short_conv_kernel_size;
  const int64_t hid = c.hidden_size;
  wq_ = b.linear(p + "q_proj", P_, hid);
  wk_ = b.linear(p + "k_proj", P_, hid);
  wv_ = b.linear(p + "v_proj", P_, hid);
  const char* conv_names[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> w = b.vec(p + conv_names[i], {P_, 1, W_});
    conv_w_[i].assign(w.size(), 0.0f);
    for (int64_t c = 0; c < P_ && !w.empty(); ++c)
      for (int64_t k = 0; k < W_; ++k) conv_w_[i][static_cast<size_t>(k * P_ + c)] = w[static_cast<size_t>(c * W_ + k)];
  }
  wfa_ = b.linear(p + "f_a_proj", D_, hid);
  wfb_ = b.linear(p + "f_b_proj", P_, D_);
  wb_ = b.linear(p + "b_proj", H_, hid);
  dt_bias_ = b.vec(p + "dt_bias", {P_});
  // A_log is per head: Kimi Linear stores [1,1,H,1]; K3 stores [head_dim] padded past H.
  std::vector<std::vector<int64_t>> a_shapes = {{1, 1, H_, 1}, {H_}};
  if (D_ > H_) a_shapes.push_back({D_});
  const std::vector<float> a_log = b.vec_any(p + "A_log", a_shapes);
  a_exp_.resize(static_cast<size_t>(H_));
  if (b.ok())
    for (int64_t h = 0; h < H_; ++h) a_exp_[static_cast<size_t>(h)] = std::exp(a_log[static_cast<size_t>(h)]);
  o_norm_ = b.vec(p + "o_norm.weight", {D_});
  if (c.linear_attn.use_full_rank_gate) {
    wg_ = b.linear(p + "g_proj", P_, hid);
  } else {
    wga_ = b.linear(p + "g_a_proj", D_, hid);
    wgb_ = b.linear(p + "g_b_proj", P_, D_);
  }
  wo_ = b.linear(p + "o_proj", hid, P_);
  return b.status();
}

// Depthwise causal conv over time (kernel W, no bias) + SiLU; conv_state holds the previous W-1
// inputs [W-1, P] oldest first and is advanced by T tokens.
void KdaLayer::short_conv(const float* in, int64_t T, int which, float* conv_state, float* out) {
  const float* w = conv_w_[which].data();
  const int64_t hist = W_ - 1;
  auto input_at = [&](int64_t t, int64_t c) -> float {  // t may be negative (history)
    return t >= 0 ? in[t * P_ + c] : conv_state[(hist + t) * P_ + c];
  };
  // Token-major, channels innermost (vectorized); per (t, c) the taps are summed in order k = 0..W-1.
  kernels::parallel_for(0, T, 1, T * P_ * W_ >= (1 << 16), [&](int64_t t) {
    float* o = out + t * P_;
    std::fill(o, o + P_, 0.0f);
    for (int64_t k = 0; k < W_; ++k) {
      const int64_t ts = t - hist + k;
      const float* src = ts >= 0 ? in + ts * P_ : conv_state + (hist + ts) * P_;
      const float* wk = w + k * P_;
      for (int64_t c = 0; c < P_; ++c) o[c] += wk[c] * src[c];
    }
    kernels::silu_inplace(o, P_);
  });
  // Advance the history: new state row r holds input at time T - hist + r.
  std::vector<float>& next = shared_temps<Temps>().conv_next;  // on the calling thread
  next.resize(static_cast<size_t>(hist * P_));
  for (int64_t r = 0; r < hist; ++r)
    for (int64_t c = 0; c < P_; ++c) next[static_cast<size_t>(r * P_ + c)] = input_at(T - hist + r, c);
  std::copy(next.begin(), next.end(), conv_state);
}

void KdaLayer::forward(const float* x, int64_t T, std::span<const Segment<KdaState>> segs, float* out,
                       bool force_recurrent) {
  const size_t TP = static_cast<size_t>(T * P_);
  Temps& ts = shared_temps<Temps>();
  // Every product that reads x runs in one parallel region: q, k, v, the decay gate's low-rank
  // input, beta and the output gate (full rank, or its low-rank input).
  const kernels::WeightMatrix* w[3] = {&wq_, &wk_, &wv_};
  for (int i = 0; i < 3; ++i) {
    ts.proj[i].resize(TP);
    ts.act[i].resize(TP);
  }
  ts.f_low.resize(static_cast<size_t>(T * D_));
  ts.f.resize(TP);
  ts.beta.resize(static_cast<size_t>(T * H_));
  ts.gate.resize(TP);
  const bool full_gate = c_->linear_attn.use_full_rank_gate;
  if (!full_gate) ts.gate_low.resize(static_cast<size_t>(T * D_));
  const kernels::MatmulTask from_x[6] = {
      {w[0], x, T, ts.proj[0].data()}, {w[1], x, T, ts.proj[1].data()}, {w[2], x, T, ts.proj[2].data()},
      {&wfa_, x, T, ts.f_low.data()},  {&wb_, x, T, ts.beta.data()},
      full_gate ? kernels::MatmulTask{&wg_, x, T, ts.gate.data()} : kernels::MatmulTask{&wga_, x, T, ts.gate_low.data()}};
  kernels::matmul_many(from_x);
  if (full_gate) {
    kernels::matmul(wfb_, ts.f_low.data(), T, ts.f.data());
  } else {
    const kernels::MatmulTask up[2] = {{&wfb_, ts.f_low.data(), T, ts.f.data()}, {&wgb_, ts.gate_low.data(), T, ts.gate.data()}};
    kernels::matmul_many(up);
  }
  for (int i = 0; i < 3; ++i)
    for (const auto& sg : segs)
      short_conv(ts.proj[i].data() + sg.offset * P_, sg.T, i, sg.state->conv + i * (W_ - 1) * P_,
                 ts.act[i].data() + sg.offset * P_);
  kernels::l2_norm(ts.act[0].data(), T * H_, D_, 1e-6f);
  kernels::l2_norm(ts.act[1].data(), T * H_, D_, 1e-6f);

  // Decay gate g [T, H, D] (log space), in ts.f.
  const bool bounded = c_->linear_attn.gate_lower_bound.has_value();
  const float lb = bounded ? *c_->linear_attn.gate_lower_bound : 0.0f;
  // A libm exp and log1p per element (~20 ns): one decode token's H·D elements are worth both threads.
  kernels::parallel_for(0, T * P_, 1, T * P_ >= (1 << 11), [&](int64_t i) {  // i = t·P + c
    const int64_t c = i % P_;
    float& g = ts.f[static_cast<size_t>(i)];
    const float a = a_exp_[static_cast<size_t>(c / D_)];
    const float z = g + dt_bias_[static_cast<size_t>(c)];
    if (bounded) {
      g = lb * kernels::sigmoid(a * z);
    } else {
      const float sp = z > 20.0f ? z : std::log1p(std::exp(z));
      g = -a * sp;
    }
  });
  for (float& v : ts.beta) v = kernels::sigmoid(v);

  ts.o.resize(TP);
  // Recurrent segments (decode) of all sequences run in one parallel region; chunked ones each
  // parallelise over heads.
  std::vector<kernels::KdaArgs>& rec = ts.rec;
  rec.clear();
  for (const auto& sg : segs) {
    kernels::KdaArgs a;
    a.T = sg.T;
    a.H = H_;
    a.K = D_;
    a.V = D_;
    a.q = ts.act[0].data() + sg.offset * P_;
    a.k = ts.act[1].data() + sg.offset * P_;
    a.v = ts.act[2].data() + sg.offset * P_;
    a.g = ts.f.data() + sg.offset * P_;
    a.beta = ts.beta.data() + sg.offset * H_;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D_));
    a.state = sg.state->recurrent;
    a.out = ts.o.data() + sg.offset * P_;
    if (sg.T == 1 || force_recurrent) rec.push_back(a);
    else kernels::kda_chunked(a, 64);
  }
  if (!rec.empty()) kernels::kda_recurrent_many(rec);

  // Output gate (computed above) and per-head gated RMSNorm (sigmoid).
  kernels::rms_norm(ts.o.data(), o_norm_.data(), T * H_, D_, c_->rms_norm_eps, ts.o.data());
  kernels::parallel_for(0, static_cast<int64_t>(TP), 1, TP >= (1u << 14),
                        [&](int64_t i) { ts.o[static_cast<size_t>(i)] *= kernels::sigmoid(ts.gate[static_cast<size_t>(i)]); });
  matmul(wo_, ts.o.data(), T, out);
}

}  // namespace kestrel
