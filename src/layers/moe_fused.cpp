// A MoE layer's experts on GGUF int8 weights (Q4_0 / Q8_0 / MXFP4) in one parallel region, for decode and
// batched decode (1–8 tokens per expert):
//   A. each token's input quantized to Q8_0 once (shared by all its experts and the shared experts);
//   B. work items (expert, 128-row stripe of the intermediate width): gate and up of that stripe for the
//      expert's tokens, read straight from the quantized input by token index (no gathered copies), the
//      activation, and the stripe's Q8_0 quantization for the down projection (a 128-aligned stripe holds
//      whole quantization blocks, so no later pass over the rows is needed);
//   C. work items (row stripe of the output): every active expert's down rows of the stripe, then the
//      weighted combine of the stripe, per token in ascending expert id (add_weighted), so the sums are
//      the grouped path's operations in its order.
// Two barriers (after A, after B) instead of the grouped path's three regions (gate/up, activation, down)
// with their quantization barriers and serial gather and combine. Items are dynamically scheduled, so
// both cores stay busy whatever the token count per expert. Every product goes through gguf_int8_product(_at):
// Q4_0 and MXFP4 (as loaded from a file) on their packed rows (gguf_q4_x16.h, one kernel at every T); Q8_0 /
// in-place MXFP4 on the small-T kernel (gguf_int8_rows_at) or, for the shared experts at
// T ≥ gguf_int8_gemm_min_tokens and the routed experts that receive that many tokens (prefill), the GEMM form
// (gguf_int8_gemm_rows / _at), all of which give each token the bits matmul_many gives it: the result equals
// forward_grouped's bit for bit.
#include <omp.h>

#include <algorithm>

#include "base/env_switch.h"
#include "kernels/cpu/gguf_int8.h"
#include "kernels/cpu/parallel.h"
#include "layers/ffn.h"
#include "layers/moe_combine.h"
#include "layers/shared_temps.h"

namespace kestrel {

using kernels::Q8Acts;
using kernels::WeightMatrix;

namespace {
EnvSwitch g_fused("KESTREL_MOE_FUSED", /*default_on=*/true);

constexpr int64_t kUpStripe = 128;   // rows of gate/up per item: one 128-element chunk of the activated row
constexpr int64_t kDownStripe = 64;  // output rows per down/combine item
constexpr int64_t kQuantTokens = 4;  // tokens per input-quantization piece

bool int8_mlp(const GatedMlp& m) {
  return kernels::is_gguf_int8_format(m.gate_weight().format) && kernels::is_gguf_int8_format(m.up_weight().format) &&
         kernels::is_gguf_int8_format(m.down_weight().format);
}

// The layouts an input needs (Q8Acts::gemm_q4 / gemm_q8 / gemm_mx).
using Layouts = kernels::Q8Layouts;

// Adds the layout a product on w over T tokens wants (the packed kernels' Q4_0 layout for Q4_0 and packed
// MXFP4; for the others their GEMM form's, or the small-T kernel's loads).
void gemm_layouts(const WeightMatrix& w, int64_t T, Layouts& l) {
  const Layouts n = kernels::gguf_int8_layout(w, T);
  l.q4 = l.q4 || n.q4;
  l.q8 = l.q8 || n.q8;
  l.mx = l.mx || n.mx;
}

void prepare(Q8Acts& a, int64_t T, int64_t in, const Layouts& l) { kernels::q8_acts_prepare(a, T, in, l.q4, l.q8, l.mx); }

// A routed expert's rows [r0, r1) for its n tokens picked from a by index.
void picked_rows(const WeightMatrix& w, const Q8Acts& a, const int32_t* tok, int64_t n, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  kernels::gguf_int8_product_at(w, a, tok, n, y, ldy, r0, r1);
}

// y rows [r0, r1) of w over every token of a (the shared experts), in the form matmul_many picks.
void all_tokens_rows(const WeightMatrix& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  kernels::gguf_int8_product(w, a, y, ldy, r0, r1);
}
}  // namespace

bool moe_fused_enabled() { return g_fused.on(); }

void set_moe_fused(bool on) { g_fused.set(on); }

void MoeBlock::bind_fused() {
  const int64_t inter = c_->moe_intermediate_size;
  fused_formats_ = !sharded() && inter % 32 == 0;
  for (const GatedMlp& ex : experts_) fused_formats_ = fused_formats_ && int8_mlp(ex);
  if (has_shared_) fused_formats_ = fused_formats_ && int8_mlp(shared_);
  if (!fused_formats_) return;
  // Capacity for the most items a call can have, so decode never grows these.
  const int64_t sh_inter = has_shared_ ? static_cast<int64_t>(c_->num_shared_experts) * inter : 0;
  auto stripes = [](int64_t n) { return (n + kUpStripe - 1) / kUpStripe; };
  fused_items_.reserve(static_cast<size_t>(E_ * stripes(inter) + stripes(sh_inter)));
  fused_experts_.reserve(static_cast<size_t>(E_));
}

bool MoeBlock::fused_applies(int64_t T) const {
  return fused_formats_ && T > 0 && moe_fused_enabled() && kernels::gguf_int8_applies(experts_.front().gate_weight());
}

void MoeBlock::forward_fused(const float* x, const float* in, int64_t T) {
  Temps& ts = shared_temps<Temps>();
  const int64_t hid = c_->hidden_size, inter = c_->moe_intermediate_size;
  const int64_t sh_inter = has_shared_ ? static_cast<int64_t>(c_->num_shared_experts) * inter : 0;
  // Active experts ascending; routed row off + i is token ts.fused_tok[off + i] of expert fused_experts_[j].
  const int64_t rows = T * K_;
  ts.fused_tok.resize(static_cast<size_t>(rows));
  ts.fused_w.resize(static_cast<size_t>(rows));
  ts.fused_row.resize(static_cast<size_t>(rows));
  fused_experts_.clear();
  int64_t off = 0;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& toks = by_expert_[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    fused_experts_.push_back({e, off, static_cast<int64_t>(toks.size())});
    for (const auto& [t, w] : toks) {
      ts.fused_tok[static_cast<size_t>(off)] = static_cast<int32_t>(t);
      ts.fused_w[static_cast<size_t>(off)] = w;
      ts.fused_row[static_cast<size_t>(off)] = static_cast<int32_t>(off);
      ++off;
    }
  }
  // Quantized inputs; the shared experts' products carry the GEMM layout where matmul_many would use it.
  // The routed experts' inputs carry the layout of the experts' GEMM form when one of them gets that many tokens.
  const bool same_input = in == x;
  Layouts xl, hl, rx, rh;
  if (has_shared_) {
    gemm_layouts(shared_.gate_weight(), T, xl);
    gemm_layouts(shared_.up_weight(), T, xl);
    gemm_layouts(shared_.down_weight(), T, hl);
  }
  for (const FusedExpert& fe : fused_experts_) {
    const GatedMlp& ex = experts_[static_cast<size_t>(fe.e)];
    gemm_layouts(ex.gate_weight(), fe.n, rx);
    gemm_layouts(ex.up_weight(), fe.n, rx);
    gemm_layouts(ex.down_weight(), fe.n, rh);
  }
  Layouts fxl = rx;
  if (same_input) fxl.q4 = fxl.q4 || xl.q4, fxl.q8 = fxl.q8 || xl.q8, fxl.mx = fxl.mx || xl.mx;
  prepare(ts.fx, T, in_, fxl);
  if (has_shared_ && !same_input) prepare(ts.fxs, T, hid, xl);
  const Q8Acts& xs = same_input ? ts.fx : ts.fxs;
  prepare(ts.fh, rows, inter, rh);
  if (has_shared_) prepare(ts.fsh, T, sh_inter, hl);
  ts.g.resize(static_cast<size_t>(rows * inter));
  ts.u.resize(static_cast<size_t>(rows * inter));
  ts.eout.resize(static_cast<size_t>(rows * in_));
  ts.acc.resize(static_cast<size_t>(T * in_));

  // Phase B items, the shared experts (all T tokens) first, then every active expert's stripes.
  fused_items_.clear();
  for (int64_t r = 0; r < sh_inter; r += kUpStripe) fused_items_.push_back({-1, r, std::min(sh_inter, r + kUpStripe)});
  for (size_t j = 0; j < fused_experts_.size(); ++j)
    for (int64_t r = 0; r < inter; r += kUpStripe) fused_items_.push_back({static_cast<int32_t>(j), r, std::min(inter, r + kUpStripe)});
  const int64_t n_up = static_cast<int64_t>(fused_items_.size());
  const int64_t width = std::max<int64_t>(in_, has_shared_ ? hid : 0);
  const int64_t n_down = (width + kDownStripe - 1) / kDownStripe;
  const int64_t n_quant = (T + kQuantTokens - 1) / kQuantTokens;
  const int64_t n_quant_all = has_shared_ && !same_input ? 2 * n_quant : n_quant;

  auto quantize = [&](int64_t k) {
    const bool shared_in = k >= n_quant;
    const int64_t t0 = (shared_in ? k - n_quant : k) * kQuantTokens, t1 = std::min(T, t0 + kQuantTokens);
    if (shared_in) return kernels::q8_acts_fill(x, t0, t1, ts.fxs);
    kernels::q8_acts_fill(in, t0, t1, ts.fx);
  };
  auto up = [&](int64_t k) {
    const FusedItem& it = fused_items_[static_cast<size_t>(k)];
    const int64_t r0 = it.r0, r1 = it.r1, c0 = r0 / 128, c1 = (r1 + 127) / 128;
    if (it.expert < 0) {
      all_tokens_rows(shared_.gate_weight(), xs, ts.sg.data(), sh_inter, r0, r1);
      all_tokens_rows(shared_.up_weight(), xs, ts.su.data(), sh_inter, r0, r1);
      for (int64_t t = 0; t < T; ++t) {
        float* g = ts.sg.data() + t * sh_inter;
        shared_.activate(g + r0, ts.su.data() + t * sh_inter + r0, r1 - r0);
        kernels::q8_acts_fill_chunks(g, t, c0, c1, ts.fsh);
      }
      return;
    }
    const FusedExpert& fe = fused_experts_[static_cast<size_t>(it.expert)];
    const GatedMlp& ex = experts_[static_cast<size_t>(fe.e)];
    const int32_t* tok = ts.fused_tok.data() + fe.off;
    float* g = ts.g.data() + fe.off * inter;
    float* u = ts.u.data() + fe.off * inter;
    picked_rows(ex.gate_weight(), ts.fx, tok, fe.n, g, inter, r0, r1);
    picked_rows(ex.up_weight(), ts.fx, tok, fe.n, u, inter, r0, r1);
    ex.add_gate_up_bias(g, u, fe.n, inter, r0, r1);
    for (int64_t i = 0; i < fe.n; ++i) {
      ex.activate(g + i * inter + r0, u + i * inter + r0, r1 - r0);
      kernels::q8_acts_fill_chunks(g + i * inter, fe.off + i, c0, c1, ts.fh);
    }
  };
  auto down = [&](int64_t k) {
    const int64_t d0 = k * kDownStripe, d1 = std::min(in_, d0 + kDownStripe);
    if (has_shared_ && d0 < hid) all_tokens_rows(shared_.down_weight(), ts.fsh, ts.shared_out.data(), hid, d0, std::min(hid, d0 + kDownStripe));
    if (d0 >= in_) return;
    for (const FusedExpert& fe : fused_experts_) {
      const GatedMlp& ex = experts_[static_cast<size_t>(fe.e)];
      picked_rows(ex.down_weight(), ts.fh, ts.fused_row.data() + fe.off, fe.n, ts.eout.data() + fe.off * in_, in_, d0, d1);
      ex.add_down_bias(ts.eout.data() + fe.off * in_, fe.n, in_, d0, d1);
    }
    // Weighted sum per token, experts in ascending order (forward_grouped's operations, stripe by stripe).
    for (int64_t t = 0; t < T; ++t) std::fill(ts.acc.data() + t * in_ + d0, ts.acc.data() + t * in_ + d1, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      add_weighted(ts.acc.data() + ts.fused_tok[static_cast<size_t>(r)] * in_ + d0, ts.eout.data() + r * in_ + d0,
                   ts.fused_w[static_cast<size_t>(r)], d1 - d0);
  };

  if (!kernels::threads_available()) {
    for (int64_t k = 0; k < n_quant_all; ++k) quantize(k);
    for (int64_t k = 0; k < n_up; ++k) up(k);
    for (int64_t k = 0; k < n_down; ++k) down(k);
    return;
  }
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_quant_all; ++k) quantize(k);
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_up; ++k) up(k);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t k = 0; k < n_down; ++k) down(k);
  }
}

}  // namespace kestrel
