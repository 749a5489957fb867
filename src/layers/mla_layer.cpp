#include "layers/mla_layer.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dsa_indexer.h"
#include "base/check.h"
#include "kernels/cpu/elementwise.h"

namespace kestrel {

using kernels::matmul;

Status MlaLayer::bind(Binder& b, const std::string& p, const TextConfig& c, bool sparse) {
  c_ = &c;
  nh_ = c.num_attention_heads;
  dn_ = c.qk_nope_head_dim;
  dr_ = c.qk_rope_head_dim;
  dv_ = c.v_head_dim;
  lora_ = c.kv_lora_rank;
  qk_ = dn_ + dr_;
  const int64_t hid = c.hidden_size;
  if (c.q_lora_rank > 0) {
    wqa_ = b.linear(p + "q_a_proj", c.q_lora_rank, hid);
    q_norm_ = b.vec(p + "q_a_layernorm.weight", {c.q_lora_rank});
    wqb_ = b.linear(p + "q_b_proj", nh_ * qk_, c.q_lora_rank);
  } else {
    wq_ = b.linear(p + "q_proj", nh_ * qk_, hid);
  }
  wkva_ = b.linear(p + "kv_a_proj_with_mqa", lora_ + dr_, hid);
  kv_norm_ = b.vec(p + "kv_a_layernorm.weight", {lora_});
  wkvb_ = b.linear(p + "kv_b_proj", nh_ * (dn_ + dv_), lora_);
  if (c.mla_use_output_gate) wg_ = b.linear(p + "g_proj", nh_ * dv_, hid);
  wo_ = b.linear(p + "o_proj", hid, nh_ * dv_);
  if (sparse) {
    if (c.q_lora_rank <= 0) return unsupported(p + "indexer: DSA needs the q latent (q_lora_rank > 0)");
    indexer_ = std::make_unique<DsaIndexer>();
    KESTREL_RETURN_IF_ERROR(indexer_->bind(b, p + "indexer.", c));
  }
  return b.status();
}

void MlaLayer::forward(const float* x, int64_t T, std::span<const Segment<MlaCache>> segs, float* out,
                       MlaMode mode) {
  // Queries [T, nh, qk].
  q_.resize(static_cast<size_t>(T * nh_ * qk_));
  if (c_->q_lora_rank > 0) {
    qa_.resize(static_cast<size_t>(T * c_->q_lora_rank));
    matmul(wqa_, x, T, qa_.data());
    kernels::rms_norm(qa_.data(), q_norm_.data(), T, c_->q_lora_rank, c_->mla_q_norm_eps, qa_.data());
    matmul(wqb_, qa_.data(), T, q_.data());
  } else {
    matmul(wq_, x, T, q_.data());
  }
  // Latent cache rows for the new tokens.
  const int64_t row = lora_ + dr_;
  ckv_.resize(static_cast<size_t>(T * row));
  matmul(wkva_, x, T, ckv_.data());
  for (int64_t t = 0; t < T; ++t)
    kernels::rms_norm(ckv_.data() + t * row, kv_norm_.data(), 1, lora_, c_->mla_kv_norm_eps, ckv_.data() + t * row);

  // DSA: every segment's queries pick their top-k cached positions (keys appended first).
  if (indexer_) {
    idx_segs_.clear();
    for (const auto& sg : segs) idx_segs_.push_back({sg.offset, sg.T, &sg.state->indexer});
    idx_.resize(static_cast<size_t>(T * indexer_->dims().topk));
    indexer_->forward(x, qa_.data(), T, idx_segs_, idx_.data());
  }

  attn_.resize(static_cast<size_t>(T * nh_ * dv_));
  for (const auto& sg : segs) {
    MlaCache& cache = *sg.state;
    KCHECK(cache.n_tokens + sg.T <= cache.capacity(), "MLA cache pages do not cover the new tokens");
    for (int64_t t = 0; t < sg.T; ++t)
      std::copy_n(ckv_.data() + (sg.offset + t) * row, row, cache.row_ptr(cache.n_tokens + t, row));
    cache.n_tokens += sg.T;
    if (indexer_) {  // sparse MLA runs in the absorbed (MQA) form only, gathering the selected rows
      attend_absorbed(sg.offset, sg.T, cache, idx_.data() + sg.offset * indexer_->dims().topk);
      continue;
    }
    const MlaMode m = mode != MlaMode::kAuto ? mode : (sg.T <= 16 ? MlaMode::kAbsorbed : MlaMode::kExpanded);
    if (m == MlaMode::kExpanded) attend_expanded(sg.offset, sg.T, cache);
    else attend_absorbed(sg.offset, sg.T, cache);
  }

  if (c_->mla_use_output_gate) {
    gate_.resize(attn_.size());
    matmul(wg_, x, T, gate_.data());
#pragma omp parallel for schedule(static) if (attn_.size() >= (1u << 14))
    for (size_t i = 0; i < attn_.size(); ++i) attn_[i] *= kernels::sigmoid(gate_[i]);
  }
  matmul(wo_, attn_.data(), T, out);
}

// Up-projects every cached latent to per-head keys [k_nope | k_r] and values, then MHA.
void MlaLayer::attend_expanded(int64_t off, int64_t T, const MlaCache& cache) {
  const int64_t L = cache.n_tokens, row = lora_ + dr_;
  // kv_b on the cached latents: needs them contiguous without the k_r tail.
  std::vector<float>& lat = olat_;
  lat.resize(static_cast<size_t>(L * lora_));
  for (int64_t j = 0; j < L; ++j) std::copy_n(cache.row_ptr(j, row), lora_, lat.data() + j * lora_);
  kv_.resize(static_cast<size_t>(L * nh_ * (dn_ + dv_)));
  matmul(wkvb_, lat.data(), L, kv_.data());
  k_.resize(static_cast<size_t>(L * nh_ * qk_));
  v_.resize(static_cast<size_t>(L * nh_ * dv_));
  for (int64_t j = 0; j < L; ++j)
    for (int64_t h = 0; h < nh_; ++h) {
      const float* src = kv_.data() + (j * nh_ + h) * (dn_ + dv_);
      float* kd = k_.data() + (j * nh_ + h) * qk_;
      std::copy_n(src, dn_, kd);
      std::copy_n(cache.row_ptr(j, row) + lora_, dr_, kd + dn_);
      std::copy_n(src + dn_, dv_, v_.data() + (j * nh_ + h) * dv_);
    }
  kernels::AttentionArgs a;
  a.T = T, a.L = L, a.H = nh_, a.Dk = qk_, a.Dv = dv_;
  a.q = q_.data() + off * nh_ * qk_;
  a.k = k_.data(), a.k_token_stride = nh_ * qk_, a.k_head_stride = qk_;
  a.v = v_.data(), a.v_token_stride = nh_ * dv_, a.v_head_stride = dv_;
  a.scale = 1.0f / std::sqrt(static_cast<float>(qk_));
  a.out = attn_.data() + off * nh_ * dv_;
  kernels::causal_attention(a);
}

// Weight absorption: q_lat = W_UK^T q_nope ‖ q_r; MQA over the 576-wide latent rows with values
// = the first kv_lora entries; out_h = W_UV o_lat.
void MlaLayer::attend_absorbed(int64_t off, int64_t T, const MlaCache& cache, const int32_t* idx) {
  const int64_t L = cache.n_tokens, row = lora_ + dr_, per_head = dn_ + dv_;
  qlat_.resize(static_cast<size_t>(T * nh_ * row));
  wblk_.resize(static_cast<size_t>(per_head * lora_));
  for (int64_t h = 0; h < nh_; ++h) {
    for (int64_t r = 0; r < per_head; ++r) kernels::decode_row(wkvb_, h * per_head + r, wblk_.data() + r * lora_);
    for (int64_t t = 0; t < T; ++t) {
      const float* qn = q_.data() + ((off + t) * nh_ + h) * qk_;
      float* ql = qlat_.data() + (t * nh_ + h) * row;
      std::fill(ql, ql + lora_, 0.0f);
      for (int64_t d = 0; d < dn_; ++d) {
        const float s = qn[d];
        const float* wr = wblk_.data() + d * lora_;
        for (int64_t cidx = 0; cidx < lora_; ++cidx) ql[cidx] += s * wr[cidx];
      }
      std::copy_n(qn + dn_, dr_, ql + lora_);
    }
  }
  olat_.resize(static_cast<size_t>(T * nh_ * lora_));
  if (idx) {
    kernels::SparseMlaArgs a;
    a.T = T, a.H = nh_, a.Dk = row, a.Dv = lora_, a.topk = indexer_->dims().topk;
    a.q = qlat_.data();
    a.pages = cache.pages.data(), a.page_tokens = cache.page_tokens, a.row = row;
    a.idx = idx;
    a.scale = 1.0f / std::sqrt(static_cast<float>(qk_));
    a.out = olat_.data();
    kernels::sparse_mla_attention(a);
  } else {
    kernels::AttentionArgs a;
    a.T = T, a.L = L, a.H = nh_, a.Dk = row, a.Dv = lora_;
    a.q = qlat_.data();
    a.pages = cache.pages.data(), a.page_tokens = cache.page_tokens;
    a.k_offset = 0, a.k_token_stride = row, a.k_head_stride = 0;
    a.v_offset = 0, a.v_token_stride = row, a.v_head_stride = 0;
    a.scale = 1.0f / std::sqrt(static_cast<float>(qk_));
    a.out = olat_.data();
    kernels::causal_attention(a);
  }
  for (int64_t h = 0; h < nh_; ++h) {
    for (int64_t r = 0; r < dv_; ++r) kernels::decode_row(wkvb_, h * per_head + dn_ + r, wblk_.data() + r * lora_);
    for (int64_t t = 0; t < T; ++t) {
      const float* ol = olat_.data() + (t * nh_ + h) * lora_;
      float* o = attn_.data() + ((off + t) * nh_ + h) * dv_;
      for (int64_t e = 0; e < dv_; ++e) {
        const float* wr = wblk_.data() + e * lora_;
        float s = 0;
        for (int64_t cidx = 0; cidx < lora_; ++cidx) s += wr[cidx] * ol[cidx];
        o[e] = s;
      }
    }
  }
}

}  // namespace kestrel
