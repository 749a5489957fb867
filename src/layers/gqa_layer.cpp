#include "layers/gqa_layer.h"

#include <algorithm>
#include <cmath>

#include <omp.h>

#include "base/check.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gqa_decode.h"
#include "kernels/cpu/kv_row.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefill_attention.h"
#include "layers/rope.h"
#include "layers/shared_temps.h"

namespace kestrel {
namespace {

// Segments of up to this many tokens attend straight from the rows (gqa_decode), longer ones through the packed
// keys of the tiled kernel. Each decode item reads every cached key once per query, the tiled kernel once per 64
// queries after packing them: on qwen3moe-bench after 4096 cached tokens (AMD EPYC Zen 4, 2 threads) 2 / 4 / 8
// new tokens took 35 / 34 / 25 tok/s in place against 22 / 33 / 54 packed.
constexpr int64_t kDecodeMaxT = 4;

}  // namespace

Status GqaLayer::bind(Binder& b, const std::string& p, const TextConfig& c, int layer) {
  c_ = &c;
  nh_ = c.num_attention_heads;
  nkv_ = c.num_key_value_heads;
  hd_ = c.head_dim;
  const int64_t hid = c.hidden_size;
  wq_ = b.linear(p + "q_proj", nh_ * hd_, hid);
  wk_ = b.linear(p + "k_proj", nkv_ * hd_, hid);
  wv_ = b.linear(p + "v_proj", nkv_ * hd_, hid);
  wo_ = b.linear(p + "o_proj", hid, nh_ * hd_);
  if (c.qk_norm) {
    q_norm_ = b.vec(p + "q_norm.weight", {hd_});
    k_norm_ = b.vec(p + "k_norm.weight", {hd_});
  }
  if (c.attention_bias) {
    bq_ = b.vec(p + "q_proj.bias", {nh_ * hd_});
    bk_ = b.vec(p + "k_proj.bias", {nkv_ * hd_});
    bv_ = b.vec(p + "v_proj.bias", {nkv_ * hd_});
    bo_ = b.vec(p + "o_proj.bias", {hid});
  }
  if (c.attn_sinks) sinks_ = b.vec(p + "sinks", {nh_});
  window_ = c.gqa_window.empty() ? 0 : c.gqa_window[static_cast<size_t>(layer)];
  // transformers' RoPE tables in fp32: plain inv_freq[i] = 1 / theta^(2i / d), or YaRN's blend (MlaRope).
  const MlaRope rope(c.gqa_rope, hd_);
  inv_freq_ = rope.inv_freq();
  rope_mag_ = rope.magnitude();
  scale_ = 1.0f / std::sqrt(static_cast<float>(hd_));
  return b.status();
}

namespace {
// y[t, :] += bias for T rows of stride ld.
void add_bias(float* y, const std::vector<float>& bias, int64_t T, int64_t ld) {
  if (bias.empty()) return;
  const auto n = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) y[t * ld + i] += bias[static_cast<size_t>(i)];
}
}  // namespace

void GqaLayer::forward(const float* x, int64_t T, std::span<const Segment<MlaCache>> segs, float* out) {
  Temps& ts = shared_temps<Temps>();
  const int64_t row = row_floats(), kw = nkv_ * hd_, half = hd_ / 2;
  ts.q.resize(static_cast<size_t>(T * nh_ * hd_));
  ts.rows.resize(static_cast<size_t>(T * row));
  ts.attn.resize(static_cast<size_t>(T * nh_ * hd_));
  // Keys and values land straight in the rows' two halves.
  const kernels::MatmulTask from_x[3] = {{&wq_, x, T, ts.q.data()},
                                         {&wk_, x, T, ts.rows.data(), row},
                                         {&wv_, x, T, ts.rows.data() + kw, row}};
  kernels::matmul_many(from_x);
  add_bias(ts.q.data(), bq_, T, nh_ * hd_);
  add_bias(ts.rows.data(), bk_, T, row);
  add_bias(ts.rows.data() + kw, bv_, T, row);
  if (c_->qk_norm) {
    kernels::rms_norm(ts.q.data(), q_norm_.data(), T * nh_, hd_, c_->rms_norm_eps, ts.q.data());
    for (int64_t t = 0; t < T; ++t)
      kernels::rms_norm(ts.rows.data() + t * row, k_norm_.data(), nkv_, hd_, c_->rms_norm_eps, ts.rows.data() + t * row);
  }
  ts.cos.resize(static_cast<size_t>(half));
  ts.sin.resize(static_cast<size_t>(half));
  auto rotate = [&](float* v) {  // NeoX: pairs (i, i + d/2), as transformers' rotate_half
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half], c = ts.cos[static_cast<size_t>(i)], s = ts.sin[static_cast<size_t>(i)];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  };
  for (const auto& sg : segs) {
    MlaCache& cache = *sg.state;
    KCHECK(cache.n_tokens + sg.T <= cache.capacity(), "GQA cache pages do not cover the new tokens");
    KCHECK(cache.row.lora == row && cache.row.rope == 0, "GQA cache rows do not match the layer's key/value shape");
    for (int64_t t = 0; t < sg.T; ++t) {
      const float pos = static_cast<float>(cache.n_tokens + t);
      for (int64_t i = 0; i < half; ++i) {
        const float a = pos * inv_freq_[static_cast<size_t>(i)];
        ts.cos[static_cast<size_t>(i)] = std::cos(a) * rope_mag_;
        ts.sin[static_cast<size_t>(i)] = std::sin(a) * rope_mag_;
      }
      const int64_t r = sg.offset + t;
      for (int64_t h = 0; h < nh_; ++h) rotate(ts.q.data() + (r * nh_ + h) * hd_);
      for (int64_t h = 0; h < nkv_; ++h) rotate(ts.rows.data() + r * row + h * hd_);
      kernels::kv_store_row(cache.row, ts.rows.data() + r * row, cache.row_ptr(cache.n_tokens + t));
    }
    cache.n_tokens += sg.T;
    if (sg.T > kDecodeMaxT) {
      attend(sg.offset, sg.T, cache);
      continue;
    }
    kernels::GqaDecodeArgs d;  // decode-like: straight from the rows, every such segment in one region below
    d.T = sg.T, d.L = cache.n_tokens, d.H = nh_, d.G = nkv_, d.D = hd_;
    d.q = ts.q.data() + sg.offset * nh_ * hd_;
    d.pages = cache.pages.data(), d.page_tokens = cache.page_tokens, d.row = cache.row;
    d.scale = scale_;
    d.window = window_;
    d.sinks = sinks_.empty() ? nullptr : sinks_.data();
    d.out = ts.attn.data() + sg.offset * nh_ * hd_;
    decode_.push_back(d);
  }
  if (!decode_.empty()) kernels::gqa_decode(decode_);
  decode_.clear();
  kernels::matmul(wo_, ts.attn.data(), T, out);
  add_bias(out, bo_, T, c_->hidden_size);
}

// The segment's L cached rows decoded into the kernel's layouts, per KV head: keys packed (pack_key_part), values
// [L, head_dim]; then the tiled kernel over the segment's T queries (the last T of the L positions).
void GqaLayer::attend(int64_t off, int64_t T, const MlaCache& cache) {
  Temps& ts = shared_temps<Temps>();
  const int64_t L = cache.n_tokens, row = row_floats(), kw = nkv_ * hd_;
  const int64_t kt_stride = kernels::packed_key_floats(L, hd_), v_stride = L * hd_;
  ts.kt.resize(static_cast<size_t>(nkv_ * kt_stride));
  ts.v.resize(static_cast<size_t>(nkv_ * v_stride));
  constexpr int64_t kSlice = 64;  // rows per work item of the unpacking
  const int64_t slices = (L + kSlice - 1) / kSlice;
  const int threads = omp_get_max_threads();
  ts.row_buf.resize(static_cast<size_t>(threads * row));
  kernels::parallel_for(0, slices, 1, L * row >= (1 << 15), [&](int64_t s) {
    float* buf = ts.row_buf.data() + omp_get_thread_num() * row;
    for (int64_t j = s * kSlice; j < std::min(L, (s + 1) * kSlice); ++j) {
      const float* r = kernels::kv_row_floats(cache.row, cache.row_ptr(j), row, buf);
      for (int64_t h = 0; h < nkv_; ++h) {
        kernels::pack_key_part(ts.kt.data() + h * kt_stride, hd_, j, 0, r + h * hd_, hd_);
        std::copy_n(r + kw + h * hd_, hd_, ts.v.data() + h * v_stride + j * hd_);
      }
    }
  });
  kernels::PrefillAttentionArgs a;
  a.T = T, a.L = L, a.H = nh_, a.Dk = hd_, a.Dv = hd_;
  a.kv_group = nh_ / nkv_;
  a.q = ts.q.data() + off * nh_ * hd_;
  a.kt = ts.kt.data(), a.kt_head_stride = kt_stride;
  a.v = ts.v.data(), a.v_head_stride = v_stride;
  a.scale = scale_;
  a.window = window_;
  a.sinks = sinks_.empty() ? nullptr : sinks_.data();
  a.out = ts.attn.data() + off * nh_ * hd_;
  kernels::prefill_attention(a);
}

}  // namespace kestrel
