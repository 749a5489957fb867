#include "layers/dsa_indexer.h"

#include <ctime>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/dsa_indexer.h"
#include "layers/rope.h"

namespace kestrel {
namespace {
// Process CPU time (all threads): the indexer's own work when one thread runs, immune to other jobs.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

Status DsaIndexer::bind(Binder& b, const std::string& p, const TextConfig& c) {
  DsaIndexerDims d;
  d.hidden = c.hidden_size, d.q_lora = c.q_lora_rank, d.H = c.index_n_heads, d.D = c.index_head_dim;
  d.rope = c.index_rope_head_dim, d.topk = c.index_topk, d.rope_theta = c.index_rope_theta, d.ue8m0 = true;
  if (c.mla_rope && d.rope > 0) {  // DeepSeek V3.2: the model's (YaRN) table, see the header
    const MlaRope model_rope(*c.mla_rope, d.rope);
    d.inv_freq = model_rope.inv_freq();
    d.rope_mag = model_rope.magnitude();
  }
  auto wq = b.linear(p + "wq_b", d.H * d.D, d.q_lora);
  auto wk = b.linear(p + "wk", d.D, d.hidden);
  auto kw = b.vec(p + "k_norm.weight", {d.D});
  auto kb = b.vec(p + "k_norm.bias", {d.D});
  auto wp = b.linear(p + "weights_proj", d.H, d.hidden);
  if (!b.ok()) return b.status();
  init(d, wq, wk, wp, std::move(kw), std::move(kb));
  return Status::ok();
}

void DsaIndexer::init(const DsaIndexerDims& d, kernels::WeightMatrix wq_b, kernels::WeightMatrix wk,
                      kernels::WeightMatrix weights_proj, std::vector<float> k_norm_w, std::vector<float> k_norm_b) {
  KCHECK(d.D == 128, "indexer head dim must be 128 (one FP8 scale per vector)");
  KCHECK(d.inv_freq.empty() || static_cast<int64_t>(d.inv_freq.size()) == d.rope / 2,
         "indexer RoPE table must have rope/2 entries");
  d_ = d;
  wq_b_ = wq_b, wk_ = wk, wproj_ = weights_proj;
  kn_w_ = std::move(k_norm_w), kn_b_ = std::move(k_norm_b);
  if (d_.inv_freq.empty()) {
    d_.inv_freq.resize(static_cast<size_t>(d.rope / 2));
    for (int64_t i = 0; i < d.rope / 2; ++i)
      d_.inv_freq[static_cast<size_t>(i)] = static_cast<float>(
          1.0 / std::pow(static_cast<double>(d.rope_theta), static_cast<double>(2 * i) / static_cast<double>(d.rope)));
  }
}

int64_t DsaIndexer::row_bytes() const { return kernels::indexer_row_bytes(d_.D); }

void DsaIndexer::forward(const float* x, const float* qr, int64_t T, std::span<const Segment<IndexerCache>> segs,
                         int32_t* idx) {
  const double t_start = cpu_now();
  const int64_t H = d_.H, D = d_.D;
  q_.resize(static_cast<size_t>(T * H * D));
  k_.resize(static_cast<size_t>(T * D));
  w_.resize(static_cast<size_t>(T * H));
  q8_.resize(static_cast<size_t>(T * H * D));
  kernels::matmul(wq_b_, qr, T, q_.data());
  kernels::matmul(wk_, x, T, k_.data());
  kernels::matmul(wproj_, x, T, w_.data());
  // LayerNorm on keys (biased variance, eps 1e-6, fp32).
  for (int64_t t = 0; t < T; ++t) {
    float* k = k_.data() + t * D;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) mean += k[i];
    mean /= static_cast<double>(D);
    for (int64_t i = 0; i < D; ++i) var += (k[i] - mean) * (k[i] - mean);
    var /= static_cast<double>(D);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + 1e-6));
    for (int64_t i = 0; i < D; ++i)
      k[i] = (k[i] - static_cast<float>(mean)) * inv * kn_w_[static_cast<size_t>(i)] + kn_b_[static_cast<size_t>(i)];
  }
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(H)) / std::sqrt(static_cast<float>(D));
  for (const auto& sg : segs) {
    IndexerCache& cache = *sg.state;
    KCHECK(cache.n_tokens + sg.T <= cache.capacity(), "indexer cache pages do not cover the new tokens");
    for (int64_t t = 0; t < sg.T; ++t) {
      const int64_t row = sg.offset + t, pos = cache.n_tokens + t;
      for (int64_t h = 0; h < H; ++h) {
        float* q = q_.data() + (row * H + h) * D;
        kernels::rope_neox(q, d_.rope, pos, d_.inv_freq.data(), d_.rope_mag);
        kernels::hadamard_rotate(q, D);
        // D == 128 (checked in init): one act_quant block, one scale per head.
        const float s = kernels::quantize_e4m3_block(q, D, d_.ue8m0, q8_.data() + (row * H + h) * D);
        w_[static_cast<size_t>(row * H + h)] *= head_scale * s;
      }
      float* k = k_.data() + row * D;
      kernels::rope_neox(k, d_.rope, pos, d_.inv_freq.data(), d_.rope_mag);
      kernels::hadamard_rotate(k, D);
      const int64_t j = cache.n_tokens + t;
      uint8_t* dst = cache.pages[static_cast<size_t>(j / cache.page_tokens)] + (j % cache.page_tokens) * row_bytes();
      const float ks = kernels::quantize_e4m3_block(k, D, d_.ue8m0, dst);
      std::memcpy(dst + D, &ks, 4);
    }
    cache.n_tokens += sg.T;
    kernels::IndexerTopkArgs a;
    a.T = sg.T, a.L = cache.n_tokens, a.H = H, a.D = D, a.topk = d_.topk;
    a.q = q8_.data() + sg.offset * H * D;
    a.w = w_.data() + sg.offset * H;
    a.pages = cache.pages.data(), a.page_tokens = cache.page_tokens;
    a.out = idx + sg.offset * d_.topk;
    kernels::indexer_topk(a);
  }
  seconds_ += cpu_now() - t_start;
}

}  // namespace kestrel
