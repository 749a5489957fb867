#include "layers/mla_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/lane_dot.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/gguf_q4_x16.h"
#include "kernels/cpu/linear_gguf.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/scratch.h"
#include "layers/shared_temps.h"

namespace kestrel {

using kernels::matmul;

namespace {

// Rows [r0, r0 + n) of a GGUF block-format matrix, in place.
kernels::WeightMatrix row_view(const kernels::WeightMatrix& w, int64_t r0, int64_t n) {
  if (kernels::x16_format(w.format)) return kernels::x16_row_view(w, r0, n);  // and its packed rows
  kernels::WeightMatrix v = w;
  const int64_t bb = kernels::gguf_block_bytes(w.format);
  v.out = n;
  if (bb > 0) v.data = static_cast<const uint8_t*>(w.data) + r0 * (w.in / 32) * bb;
  else v.data = nullptr;  // not a block format: never used (native_absorbed() is false)
  return v;
}

}  // namespace

// Float kv_b (safetensors BF16/F16/F32): the absorbed products as per-head matrices for matmul_many.
// v_b[h] = rows [h·(dn+dv) + dn, +dv) of kv_b, in place; k_b[h] is needed transposed ([lora, dn]:
// q_lat = W_UK^T q_nope), so those rows are copied once, element for element, into kb_t_.
void MlaLayer::float_head_views() {
  size_t esize = 0;
  if (wkvb_.format == kernels::WeightFormat::kF32) esize = 4;
  else if (wkvb_.format == kernels::WeightFormat::kBF16 || wkvb_.format == kernels::WeightFormat::kF16) esize = 2;
  if (esize == 0 || wkvb_.data == nullptr) return;  // FP8 block / quantized kv_b: decoded per head per step
  const int64_t per_head = dn_ + dv_;
  const auto* src = static_cast<const uint8_t*>(wkvb_.data);
  kb_t_.assign(static_cast<size_t>(nh_ * lora_ * dn_) * esize, 0);
  for (int64_t h = 0; h < nh_; ++h)
    for (int64_t d = 0; d < dn_; ++d) {
      const uint8_t* r = src + static_cast<size_t>((h * per_head + d) * lora_) * esize;
      for (int64_t c = 0; c < lora_; ++c)
        std::memcpy(kb_t_.data() + static_cast<size_t>((h * lora_ + c) * dn_ + d) * esize, r + static_cast<size_t>(c) * esize, esize);
    }
  for (int64_t h = 0; h < nh_; ++h) {
    kernels::WeightMatrix k = wkvb_, v = wkvb_;
    k.out = lora_, k.in = dn_, k.data = kb_t_.data() + static_cast<size_t>(h * lora_ * dn_) * esize;
    v.out = dv_, v.in = lora_, v.data = src + static_cast<size_t>((h * per_head + dn_) * lora_) * esize;
    kb_heads_.push_back(k);
    vb_heads_.push_back(v);
  }
}

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
  if (auto kv = b.split_kv_b(p + "kv_b_proj", nh_, dn_, dv_, lora_)) {
    for (int64_t h = 0; h < nh_; ++h) {
      kb_heads_.push_back(row_view(kv->first, h * lora_, lora_));
      vb_heads_.push_back(row_view(kv->second, h * dv_, dv_));
    }
  }
  wkvb_ = b.linear(p + "kv_b_proj", nh_ * (dn_ + dv_), lora_);
  if (kb_heads_.empty() && b.status().is_ok()) float_head_views();
  if (c.mla_use_output_gate) wg_ = b.linear(p + "g_proj", nh_ * dv_, hid);
  wo_ = b.linear(p + "o_proj", hid, nh_ * dv_);
  has_rope_ = c.mla_rope.has_value();
  if (has_rope_) rope_ = MlaRope(*c.mla_rope, dr_);
  scale_ = c.mla_softmax_scale > 0.0f ? c.mla_softmax_scale : 1.0f / std::sqrt(static_cast<float>(qk_));
  if (sparse) {
    if (c.q_lora_rank <= 0) return unsupported(p + "indexer: DSA needs the q latent (q_lora_rank > 0)");
    indexer_ = std::make_unique<DsaIndexer>();
    KESTREL_RETURN_IF_ERROR(indexer_->bind(b, p + "indexer.", c));
  }
  return b.status();
}

void MlaLayer::forward(const float* x, int64_t T, std::span<const Segment<MlaCache>> segs, float* out,
                       MlaMode mode) {
  Temps& ts = shared_temps<Temps>();
  // Queries [T, nh, qk], latent rows for the new tokens [T, lora + rope] and the output gate: the
  // products that read x run in one parallel region.
  ts.q.resize(static_cast<size_t>(T * nh_ * qk_));
  const int64_t row = lora_ + dr_;
  ts.ckv.resize(static_cast<size_t>(T * row));
  ts.attn.resize(static_cast<size_t>(T * nh_ * dv_));
  if (c_->mla_use_output_gate) ts.gate.resize(ts.attn.size());
  const bool lora_q = c_->q_lora_rank > 0;
  if (lora_q) ts.qa.resize(static_cast<size_t>(T * c_->q_lora_rank));
  kernels::MatmulTask from_x[3] = {{&wkva_, x, T, ts.ckv.data()},
                                   lora_q ? kernels::MatmulTask{&wqa_, x, T, ts.qa.data()} : kernels::MatmulTask{&wq_, x, T, ts.q.data()},
                                   {&wg_, x, T, ts.gate.data()}};
  kernels::matmul_many(std::span<const kernels::MatmulTask>(from_x, c_->mla_use_output_gate ? 3 : 2));
  if (lora_q) {
    kernels::rms_norm(ts.qa.data(), q_norm_.data(), T, c_->q_lora_rank, c_->mla_q_norm_eps, ts.qa.data());
    matmul(wqb_, ts.qa.data(), T, ts.q.data());
  }
  for (int64_t t = 0; t < T; ++t)
    kernels::rms_norm(ts.ckv.data() + t * row, kv_norm_.data(), 1, lora_, c_->mla_kv_norm_eps, ts.ckv.data() + t * row);

  // DSA: every segment's queries pick their top-k cached positions (keys appended first).
  if (indexer_) {
    idx_segs_.clear();
    for (const auto& sg : segs) idx_segs_.push_back({sg.offset, sg.T, &sg.state->indexer});
    idx_.resize(static_cast<size_t>(T * indexer_->dims().topk));
    indexer_->forward(x, ts.qa.data(), T, idx_segs_, idx_.data());
  }

  absorbed_.clear();
  for (const auto& sg : segs) {
    MlaCache& cache = *sg.state;
    KCHECK(cache.n_tokens + sg.T <= cache.capacity(), "MLA cache pages do not cover the new tokens");
    KCHECK(cache.row.lora == lora_ && cache.row.rope == dr_, "MLA cache rows do not match the layer's latent shape");
    if (has_rope_) apply_rope(sg.offset, sg.T, cache.n_tokens, row);
    for (int64_t t = 0; t < sg.T; ++t)
      kernels::kv_store_row(cache.row, ts.ckv.data() + (sg.offset + t) * row, cache.row_ptr(cache.n_tokens + t));
    cache.n_tokens += sg.T;
    if (indexer_) {  // sparse MLA runs in the absorbed (MQA) form only, gathering the selected rows
      absorbed_.push_back(sg);
      continue;
    }
    const MlaMode m = mode != MlaMode::kAuto ? mode : (sg.T <= 16 ? MlaMode::kAbsorbed : MlaMode::kExpanded);
    if (m == MlaMode::kExpanded) attend_expanded(sg.offset, sg.T, cache);
    else absorbed_.push_back(sg);
  }
  if (!absorbed_.empty()) attend_absorbed(T, absorbed_);

  if (c_->mla_use_output_gate) {
    kernels::parallel_for(0, static_cast<int64_t>(ts.attn.size()), 1, ts.attn.size() >= (1u << 14),
                          [&](int64_t i) { ts.attn[static_cast<size_t>(i)] *= kernels::sigmoid(ts.gate[static_cast<size_t>(i)]); });
  }
  matmul(wo_, ts.attn.data(), T, out);
}

// Rotates q_pe of every head and k_pe of tokens [off, off+T) of the batch, which sit at absolute
// positions pos0.. of their sequence (the cache length before they are appended).
void MlaLayer::apply_rope(int64_t off, int64_t T, int64_t pos0, int64_t row) {
  Temps& ts = shared_temps<Temps>();
  ts.cos.resize(static_cast<size_t>(rope_.pairs()));
  ts.sin.resize(static_cast<size_t>(rope_.pairs()));
  for (int64_t t = 0; t < T; ++t) {
    rope_.angles(pos0 + t, ts.cos.data(), ts.sin.data());
    rope_.rotate(ts.ckv.data() + (off + t) * row + lora_, ts.cos.data(), ts.sin.data());
    for (int64_t h = 0; h < nh_; ++h)
      rope_.rotate(ts.q.data() + ((off + t) * nh_ + h) * qk_ + dn_, ts.cos.data(), ts.sin.data());
  }
}

// Up-projects every cached latent to per-head keys [k_nope | k_r] and values, then MHA with the tiled prefill
// kernel (kernels/cpu/prefill_attention.h). The up-projected keys and values are kept between calls with a
// byte copy of the cache rows they came from: the next chunk of the same prompt finds its earlier rows
// unchanged (memcmp) and up-projects only the rows after the first that differs, so a prompt prefilled in
// chunks pays for kv_b once per token, not once per token per chunk. A token's keys and values depend only on
// its row's bytes (kv_b is row-invariant), so reused ones have the bits a fresh up-projection gives. kv_b
// runs over slices of kExpandSlice latents, each scattered straight into the kernel's per-head layouts.
void MlaLayer::attend_expanded(int64_t off, int64_t T, const MlaCache& cache) {
  Temps& ts = shared_temps<Temps>();
  constexpr int64_t kExpandSlice = 256;
  const int64_t L = cache.n_tokens, row = lora_ + dr_, per_head = dn_ + dv_;
  const int64_t row_bytes = cache.row.bytes();
  if (row_bytes != exp_row_bytes_) exp_rows_valid_ = 0, exp_row_bytes_ = row_bytes;
  int64_t reuse = 0;
  const int64_t known = std::min(exp_rows_valid_, L);
  while (reuse < known && std::memcmp(cache.row_ptr(reuse), exp_rows_.data() + reuse * row_bytes, static_cast<size_t>(row_bytes)) == 0)
    ++reuse;
  reserve_expanded(L, reuse);
  exp_rows_.resize(static_cast<size_t>(exp_cap_ * row_bytes));
  const int64_t kt_stride = kernels::packed_key_floats(exp_cap_, qk_), v_stride = exp_cap_ * dv_;
  const int64_t slice = std::min(L - reuse, kExpandSlice);
  ts.olat.resize(static_cast<size_t>(slice * lora_));
  ts.kv.resize(static_cast<size_t>(slice * nh_ * per_head));
  ts.row_buf.resize(static_cast<size_t>(slice * row));
  for (int64_t j0 = reuse; j0 < L; j0 += kExpandSlice) {
    const int64_t n = std::min(kExpandSlice, L - j0);
    for (int64_t j = 0; j < n; ++j) {  // rows decoded from the page dtype: latent for kv_b, k_r kept aside
      float* r = ts.row_buf.data() + j * row;
      kernels::kv_load_row(cache.row, cache.row_ptr(j0 + j), row, r);
      std::copy_n(r, lora_, ts.olat.data() + j * lora_);
      std::memcpy(exp_rows_.data() + (j0 + j) * row_bytes, cache.row_ptr(j0 + j), static_cast<size_t>(row_bytes));
    }
    matmul(wkvb_, ts.olat.data(), n, ts.kv.data());
    kernels::parallel_for(0, nh_, 1, n * nh_ >= 64, [&](int64_t h) {
      float* kt = kt_.data() + h * kt_stride;
      float* v = v_.data() + h * v_stride;
      for (int64_t j = 0; j < n; ++j) {
        const float* src = ts.kv.data() + (j * nh_ + h) * per_head;
        kernels::pack_key_part(kt, qk_, j0 + j, 0, src, dn_);
        kernels::pack_key_part(kt, qk_, j0 + j, dn_, ts.row_buf.data() + j * row + lora_, dr_);
        std::copy_n(src + dn_, dv_, v + (j0 + j) * dv_);
      }
    });
  }
  exp_rows_valid_ = L;
  kernels::PrefillAttentionArgs a;
  a.T = T, a.L = L, a.H = nh_, a.Dk = qk_, a.Dv = dv_;
  a.q = ts.q.data() + off * nh_ * qk_;
  a.kt = kt_.data(), a.kt_head_stride = kt_stride;
  a.v = v_.data(), a.v_head_stride = v_stride;
  a.scale = scale_;
  a.out = ts.attn.data() + off * nh_ * dv_;
  kernels::prefill_attention(a);
}

// Room for L tokens of up-projected keys and values per head (capacity doubles; the first `keep` tokens of
// every head move to the new layout).
void MlaLayer::reserve_expanded(int64_t L, int64_t keep) {
  if (L <= exp_cap_) return;
  const int64_t cap = std::max<int64_t>({L, 2 * exp_cap_, kernels::kKeyBlock});
  const int64_t old_kt = kernels::packed_key_floats(exp_cap_, qk_), new_kt = kernels::packed_key_floats(cap, qk_);
  std::vector<float> kt(static_cast<size_t>(nh_ * new_kt)), v(static_cast<size_t>(nh_ * cap * dv_));
  const int64_t keep_kt = kernels::packed_key_floats(keep, qk_);
  for (int64_t h = 0; h < nh_ && keep > 0; ++h) {
    std::copy_n(kt_.data() + h * old_kt, keep_kt, kt.data() + h * new_kt);
    std::copy_n(v_.data() + h * exp_cap_ * dv_, keep * dv_, v.data() + h * cap * dv_);
  }
  kt_ = std::move(kt), v_ = std::move(v), exp_cap_ = cap;
}

// Weight absorption: q_lat = W_UK^T q_nope ‖ q_r; MQA over the 576-wide latent rows with values
// = the first kv_lora entries; out_h = W_UV o_lat.
// Absorbed form for every decode-like segment of the batch at once: q is mapped into the latent
// space with W_kb (per head), attention runs over the 576-wide cached rows (MQA), and the latent
// output is mapped back with W_vb. Three parallel regions per layer whatever the batch size; each
// head's bf16 block of kv_b is decoded once per step into a per-thread buffer.
// Rows [r0, r0 + n) of kv_b in fp32: in place when the weight is fp32 (GGUF k_b/v_b are merged into
// an fp32 kv_b at load), else decoded into this thread's scratch.
const float* MlaLayer::head_rows(int64_t r0, int64_t n) const {
  if (wkvb_.format == kernels::WeightFormat::kF32) return static_cast<const float*>(wkvb_.data) + r0 * lora_;
  float* buf = kernels::thread_scratch(kernels::kScratchMla, static_cast<size_t>(n * lora_));
  for (int64_t r = 0; r < n; ++r) kernels::decode_row(wkvb_, r0 + r, buf + r * lora_);
  return buf;
}

void MlaLayer::attend_absorbed(int64_t T, std::span<const Segment<MlaCache>> segs) {
  Temps& ts = shared_temps<Temps>();
  const int64_t row = lora_ + dr_, per_head = dn_ + dv_;
  ts.qlat.resize(static_cast<size_t>(T * nh_ * row));
  ts.olat.resize(static_cast<size_t>(T * nh_ * lora_));
  const bool native = native_absorbed();
  if (native) {
    absorb_q_native(segs);
  } else {
    kernels::parallel_for(0, nh_, 1, true, [&](int64_t h) {
      const float* wblk = head_rows(h * per_head, dn_);
      for (const auto& sg : segs)
        for (int64_t t = sg.offset; t < sg.offset + sg.T; ++t) {
          const float* qn = ts.q.data() + (t * nh_ + h) * qk_;
          float* ql = ts.qlat.data() + (t * nh_ + h) * row;
          std::fill(ql, ql + lora_, 0.0f);
          for (int64_t d = 0; d < dn_; ++d) {
            const float s = qn[d];
            const float* wr = wblk + d * lora_;
            for (int64_t cidx = 0; cidx < lora_; ++cidx) ql[cidx] += s * wr[cidx];
          }
          std::copy_n(qn + dn_, dr_, ql + lora_);
        }
    });
  }
  if (indexer_) {  // DSA: each query attends to its own top-k positions (−1 slots skipped)
    for (const auto& sg : segs) {
      const MlaCache& cache = *sg.state;
      kernels::SparseMlaArgs a;
      a.T = sg.T, a.H = nh_, a.Dk = row, a.Dv = lora_, a.topk = indexer_->dims().topk;
      a.q = ts.qlat.data() + sg.offset * nh_ * row;
      a.pages = cache.pages.data(), a.page_tokens = cache.page_tokens, a.row = cache.row;
      a.idx = idx_.data() + sg.offset * indexer_->dims().topk;
      a.scale = scale_;
      a.out = ts.olat.data() + sg.offset * nh_ * lora_;
      kernels::sparse_mla_attention(a);
    }
  }
  std::vector<kernels::AttentionArgs>& args = attn_args_;
  args.clear();
  for (const auto& sg : segs) {
    if (indexer_) break;
    const MlaCache& cache = *sg.state;
    kernels::AttentionArgs a;
    a.T = sg.T, a.L = cache.n_tokens, a.H = nh_, a.Dk = row, a.Dv = lora_;
    a.q = ts.qlat.data() + sg.offset * nh_ * row;
    a.pages = cache.pages.data(), a.page_tokens = cache.page_tokens, a.row = cache.row;
    a.scale = scale_;
    a.out = ts.olat.data() + sg.offset * nh_ * lora_;
    args.push_back(a);
  }
  kernels::causal_attention_many(args);
  if (native) return expand_out_native(segs);
  kernels::parallel_for(0, nh_, 1, true, [&](int64_t h) {
    const float* wblk = head_rows(h * per_head + dn_, dv_);
    for (const auto& sg : segs)
      for (int64_t t = sg.offset; t < sg.offset + sg.T; ++t) {
        const float* ol = ts.olat.data() + (t * nh_ + h) * lora_;
        float* o = ts.attn.data() + (t * nh_ + h) * dv_;
        int64_t e = 0;
        for (; e + 4 <= dv_; e += 4) {  // four rows of W_UV per pass over the latent output (lane_dot.h)
          const float* wr[4] = {wblk + e * lora_, wblk + (e + 1) * lora_, wblk + (e + 2) * lora_, wblk + (e + 3) * lora_};
          kernels::lane_dot4(ol, wr, lora_, o + e);
        }
        for (; e < dv_; ++e) o[e] = kernels::lane_dot(ol, wblk + e * lora_, lora_);
      }
  });
}

bool MlaLayer::native_absorbed() const {
  if (kb_heads_.empty()) return false;
  if (!kb_t_.empty()) return true;  // float kv_b views (float_head_views)
  return kernels::gguf_int8_applies(kb_heads_[0]) && kernels::gguf_int8_applies(vb_heads_[0]);
}

// dst[t, h][0, out) = W[h] src[t, h][0, in) for every token of the absorbed segments: the tokens'
// head-h inputs are gathered ([H, n, in]), one product per head runs in one parallel region
// (matmul_many), and the outputs are scattered back. src / dst rows of (t, h) start at
// (t·H + h)·stride.
void MlaLayer::per_head_products(const std::vector<kernels::WeightMatrix>& w, const float* src, int64_t src_stride,
                                 int64_t in, float* dst, int64_t dst_stride, int64_t out,
                                 std::span<const Segment<MlaCache>> segs) {
  Temps& ts = shared_temps<Temps>();
  int64_t n = 0;
  for (const auto& sg : segs) n += sg.T;
  ts.hin.resize(static_cast<size_t>(nh_ * n * in));
  ts.hout.resize(static_cast<size_t>(nh_ * n * out));
  int64_t i = 0;
  for (const auto& sg : segs)
    for (int64_t t = sg.offset; t < sg.offset + sg.T; ++t, ++i)
      for (int64_t h = 0; h < nh_; ++h) std::copy_n(src + (t * nh_ + h) * src_stride, in, ts.hin.data() + (h * n + i) * in);
  head_tasks_.clear();
  for (int64_t h = 0; h < nh_; ++h)
    head_tasks_.push_back({&w[static_cast<size_t>(h)], ts.hin.data() + h * n * in, n, ts.hout.data() + h * n * out});
  kernels::matmul_many(head_tasks_);
  i = 0;
  for (const auto& sg : segs)
    for (int64_t t = sg.offset; t < sg.offset + sg.T; ++t, ++i)
      for (int64_t h = 0; h < nh_; ++h) std::copy_n(ts.hout.data() + (h * n + i) * out, out, dst + (t * nh_ + h) * dst_stride);
}

// q_lat[t, h] = k_b[h] q_nope[t, h] ‖ q_rope[t, h], the k_b halves as int8 products per head.
void MlaLayer::absorb_q_native(std::span<const Segment<MlaCache>> segs) {
  Temps& ts = shared_temps<Temps>();
  const int64_t row = lora_ + dr_;
  per_head_products(kb_heads_, ts.q.data(), qk_, dn_, ts.qlat.data(), row, lora_, segs);
  for (const auto& sg : segs)
    for (int64_t t = sg.offset; t < sg.offset + sg.T; ++t)
      for (int64_t h = 0; h < nh_; ++h)
        std::copy_n(ts.q.data() + (t * nh_ + h) * qk_ + dn_, dr_, ts.qlat.data() + (t * nh_ + h) * row + lora_);
}

// out[t, h] = v_b[h] o_lat[t, h], the same way.
void MlaLayer::expand_out_native(std::span<const Segment<MlaCache>> segs) {
  Temps& ts = shared_temps<Temps>();
  per_head_products(vb_heads_, ts.olat.data(), lora_, lora_, ts.attn.data(), dv_, dv_, segs);
}

}  // namespace kestrel
