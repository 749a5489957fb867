// Op-level tests of MXFP4 weights, SiTU-GLU, Block AttnRes and LatentMoE against goldens produced by
// INDEPENDENT references (tools/gen_op_goldens.py): compressed-tensors' own MXFP4 compressor
// (compress/decompress, pack_fp4_to_uint8) and torch transcriptions of sglang's Kimi-K3 code
// (SituAndMul.forward_native, aggregate_stream_torch, KimiK3MoE._forward_unfused with
// kimi_k2_biased_topk_impl and the fused_moe_forward_native einsum form). Data: tests/data/ops/.
//
// Tolerances (and why):
//  * MXFP4 decode_row: EXACT. Every golden value is E2M1 × 2^k with |k| <= 20, exactly representable
//    in fp32 (and bf16, which compressed-tensors dequantizes in); any difference is a format bug.
//  * MXFP4 matmul vs the fp64 product of the reference matrix: |y − y64| <= 1e-5 · Σ_k |x_k W_k|.
//    fp32 accumulation of n = 256 products has a worst-case error ~n·2^-24·Σ|x W| (~1.5e-5) and a
//    typical one ~sqrt(n)·2^-24·Σ|x W| (~1e-6); Σ|x W| (not |y|) is the scale because a row's 32-groups
//    span 2^±20, so y may cancel. Wrong nibble order or scale exponent gives O(1) relative errors.
//  * SiTU-GLU: per element |ours − ref| <= 1e-6 · |ref| (+1e-37 absolute for exact zeros). Both sides
//    evaluate the same fp32 formula with libm/Sleef tanh, expf (each <= ~2 ulp); 4 rounded factors stay
//    below ~8 ulp = 5e-7 relative. A wrong β (even 4.001) or a missing tanh clip fails.
//  * AttnRes: |ours − ref| <= 1e-5 · max_j max_d |row_j[t, :]| per token. The output is a convex
//    combination of the rows, so the largest row bounds the error scale; score differences (fp64 vs
//    fp32 dots) move p by ~1e-7 relative.
//  * LatentMoE: top-k ids identical (goldens were drawn so the top-(k+1) selection scores are >= 2e-3
//    apart; fp32 logit errors are ~1e-6), route weights within 1e-6 absolute (weights are O(1)
//    ratios of sigmoids), outputs |ours − ref| <= 1e-4 · max|ref| (several fp32 GEMMs of width <= 64
//    plus an RMSNorm: expected ~1e-6; 1e-4 leaves margin for accumulation-order changes only).
// Measured maxima are printed by each test.
//
// Fault injection (used to show every check can fail): set LAYER_OPS_MUTATE below to 1..6 and rebuild.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"
#include "layers/attn_res.h"
#include "layers/binder.h"
#include "layers/ffn.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"

#ifndef LAYER_OPS_MUTATE
#define LAYER_OPS_MUTATE 0  // 0 = off. 1 nibble swap, 2 scale exponent +1, 3 no up-clip in SiTU,
                            // 4 AttnRes eps 1e-4, 5 LatentMoE without latent norm, 6 tokens rotated
#endif

namespace kestrel {
namespace {

std::string ops_dir() { return std::string(KESTREL_TEST_DATA) + "/ops/"; }

struct Golden {
  SafetensorsFile file;
  const SafetensorsEntry* find(const std::string& name) const {
    for (const auto& e : file.header().entries)
      if (e.name == name) return &e;
    return nullptr;
  }
  template <typename T>
  std::vector<T> get(const std::string& name, DType dt, std::vector<int64_t>* shape = nullptr) const {
    const SafetensorsEntry* e = find(name);
    if (!e) {
      ADD_FAILURE() << "missing tensor " << name << " in " << file.path();
      return {};
    }
    TensorView tv = file.view(*e);
    EXPECT_EQ(tv.dtype, dt) << name;
    if (shape) *shape = tv.shape;
    const T* p = tv.as<T>();
    return std::vector<T>(p, p + tv.numel());
  }
  std::string meta(const std::string& key) const {
    auto it = file.header().metadata.find(key);
    return it == file.header().metadata.end() ? std::string() : it->second;
  }
};

Golden open_golden(const std::string& name) {
  auto f = SafetensorsFile::open(ops_dir() + name);
  if (!f) {
    ADD_FAILURE() << "cannot open " << ops_dir() + name << ": " << f.error().message()
                  << " (run tools/gen_op_goldens.py)";
    std::abort();
  }
  return Golden{std::move(*f)};
}

// ------------------------------------------------------------------------------------------------
// MXFP4
// ------------------------------------------------------------------------------------------------
void check_mxfp4(const char* packed_name) {
  Golden g = open_golden("mxfp4.safetensors");
  std::vector<int64_t> pshape, sshape, rshape, xshape;
  auto packed = g.get<uint8_t>(packed_name, DType::kU8, &pshape);
  auto scale = g.get<uint8_t>("scale", DType::kU8, &sshape);
  auto ref = g.get<float>("ref", DType::kF32, &rshape);
  auto x = g.get<float>("x", DType::kF32, &xshape);
  auto y64 = g.get<double>("y_ref_f64", DType::kF64);
  ASSERT_EQ(rshape.size(), 2u);
  const int64_t out = rshape[0], in = rshape[1], T = xshape[0];
  ASSERT_EQ(pshape, (std::vector<int64_t>{out, in / 2}));
  ASSERT_EQ(sshape, (std::vector<int64_t>{out, in / 32}));
#if LAYER_OPS_MUTATE == 1
  for (auto& b : packed) b = static_cast<uint8_t>((b >> 4) | (b << 4));  // GGML/CT nibble confusion
#elif LAYER_OPS_MUTATE == 2
  // Off-by-one exponent on the dominant (largest-scale) block of row 0, so it matters to y as well.
  *std::max_element(scale.begin(), scale.begin() + in / 32) += 1;
#endif
  kernels::WeightMatrix w;
  w.format = kernels::WeightFormat::kMxfp4;
  w.out = out;
  w.in = in;
  w.data = packed.data();
  w.scales = scale.data();

  // decode_row: exact.
  std::vector<float> row(static_cast<size_t>(in));
  int64_t mismatches = 0;
  for (int64_t r = 0; r < out; ++r) {
    kernels::decode_row(w, r, row.data());
    for (int64_t c = 0; c < in; ++c)
      if (row[static_cast<size_t>(c)] != ref[static_cast<size_t>(r * in + c)]) {
        if (mismatches++ < 5)
          ADD_FAILURE() << packed_name << " decode W[" << r << "," << c << "] = " << row[static_cast<size_t>(c)]
                        << " want " << ref[static_cast<size_t>(r * in + c)];
      }
  }
  EXPECT_EQ(mismatches, 0) << packed_name << ": decode_row mismatches";

  // matmul vs fp64 reference.
  std::vector<float> y(static_cast<size_t>(T * out));
  kernels::matmul(w, x.data(), T, y.data());
  double worst = 0, worst_rel_y = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double absdot = 0;
      for (int64_t c = 0; c < in; ++c)
        absdot += std::fabs(static_cast<double>(x[static_cast<size_t>(t * in + c)]) *
                            ref[static_cast<size_t>(o * in + c)]);
      const double want = y64[static_cast<size_t>(t * out + o)];
      const double err = std::fabs(y[static_cast<size_t>(t * out + o)] - want);
      worst = std::max(worst, err / absdot);
      if (std::fabs(want) > 1e-3 * absdot) worst_rel_y = std::max(worst_rel_y, err / std::fabs(want));
      EXPECT_LE(err, 1e-5 * absdot) << packed_name << " y[" << t << "," << o << "]";
    }
  std::printf("[mxfp4 %s] %lld x %lld: decode exact mismatches=%lld; matmul max err/sum|xW| = %.3g "
              "(max err/|y| where y not cancelled: %.3g)\n",
              packed_name, static_cast<long long>(out), static_cast<long long>(in),
              static_cast<long long>(mismatches), worst, worst_rel_y);
}

// Packed exactly as compressed-tensors' MXFP4PackedCompressor.compress writes it.
TEST(LayerOps, Mxfp4CompressorPacking) { check_mxfp4("packed"); }
// Same values through the bare pack_fp4_to_uint8 (keeps -0.0 as code 8).
TEST(LayerOps, Mxfp4BarePackingWithNegativeZeroCodes) { check_mxfp4("packed_bare"); }

// ------------------------------------------------------------------------------------------------
// SiTU-GLU
// ------------------------------------------------------------------------------------------------
TEST(LayerOps, SituGluMatchesSglang) {
  Golden g = open_golden("situ.safetensors");
  auto gate = g.get<float>("gate", DType::kF32);
  auto up = g.get<float>("up", DType::kF32);
  auto ref = g.get<float>("out", DType::kF32);
  ASSERT_EQ(g.meta("beta"), "4.0");
  ASSERT_EQ(g.meta("linear_beta"), "25.0");
  float beta_lin = 25.0f;
#if LAYER_OPS_MUTATE == 3
  beta_lin = 1e9f;  // forgot the soft clip of `up`
#endif
  std::vector<float> out(ref.size());
  kernels::situ_glu(gate.data(), up.data(), static_cast<int64_t>(ref.size()), 4.0f, beta_lin, out.data());
  double worst = 0;
  float max_abs_in = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_abs_in = std::max({max_abs_in, std::fabs(gate[i]), std::fabs(up[i])});
    const double err = std::fabs(static_cast<double>(out[i]) - ref[i]);
    if (ref[i] != 0) worst = std::max(worst, err / std::fabs(ref[i]));
    EXPECT_LE(err, 1e-6 * std::fabs(ref[i]) + 1e-37) << "i=" << i << " g=" << gate[i] << " u=" << up[i];
  }
  std::printf("[situ] %zu elements, max |input| %.3g: max rel err %.3g\n", ref.size(), max_abs_in, worst);
}

// ------------------------------------------------------------------------------------------------
// Block AttnRes
// ------------------------------------------------------------------------------------------------
TEST(LayerOps, AttnResMatchesSglangAggregateStreamTorch) {
  Golden g = open_golden("attn_res.safetensors");
  const int ncases = std::stoi(g.meta("num_cases"));
  float eps = std::stof(g.meta("eps"));
  ASSERT_EQ(eps, 1e-5f);
#if LAYER_OPS_MUTATE == 4
  eps = 1e-4f;
#endif
  ASSERT_GE(ncases, 5);
  for (int ci = 0; ci < ncases; ++ci) {
    const std::string p = "case" + std::to_string(ci) + ".";
    std::vector<int64_t> shape;
    auto rows = g.get<float>(p + "rows", DType::kF32, &shape);  // [n, T, D]
    auto c = g.get<float>(p + "c", DType::kF32);
    auto ref = g.get<float>(p + "out", DType::kF32);
    ASSERT_EQ(shape.size(), 3u);
    const int64_t n = shape[0], T = shape[1], D = shape[2];
    std::vector<const float*> ptrs;
    for (int64_t j = 0; j < n; ++j) ptrs.push_back(rows.data() + j * T * D);
    std::vector<float> out(static_cast<size_t>(T * D));
    attn_res_mix(ptrs, T, D, c.data(), eps, out.data());
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
      double scale = 0;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) scale = std::max(scale, static_cast<double>(std::fabs(ptrs[j][t * D + d])));
      for (int64_t d = 0; d < D; ++d) {
        const double err = std::fabs(static_cast<double>(out[t * D + d]) - ref[t * D + d]);
        worst = std::max(worst, err / scale);
        EXPECT_LE(err, 1e-5 * scale) << "case " << ci << " t=" << t << " d=" << d;
      }
    }
    std::printf("[attn_res case %d] n=%lld T=%lld D=%lld: max err / max|row| = %.3g\n", ci,
                static_cast<long long>(n), static_cast<long long>(T), static_cast<long long>(D), worst);
  }
}

// ------------------------------------------------------------------------------------------------
// LatentMoE
// ------------------------------------------------------------------------------------------------
TextConfig tiny_moe_config(const Golden& g) {
  TextConfig c;
  c.hidden_size = std::stoi(g.meta("H"));
  c.num_experts = std::stoi(g.meta("E"));
  c.num_experts_per_token = std::stoi(g.meta("top_k"));
  c.num_shared_experts = std::stoi(g.meta("num_shared_experts"));
  c.moe_intermediate_size = std::stoi(g.meta("I"));
  c.routed_expert_hidden_size = std::stoi(g.meta("L"));
  c.latent_moe_use_norm = true;
  c.moe_renormalize = true;
  c.routed_scaling_factor = std::stof(g.meta("routed_scaling_factor"));
  c.rms_norm_eps = std::stof(g.meta("rms_norm_eps"));
  c.hidden_act = Activation::kSiTU;
  c.situ_beta = 4.0f;
  c.situ_linear_beta = 25.0f;
  // Guard against the golden drifting from the values this test was written for.
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.routed_expert_hidden_size, 32);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_token, 4);
  EXPECT_EQ(c.num_shared_experts, 2);
#if LAYER_OPS_MUTATE == 5
  c.latent_moe_use_norm = false;
#endif
  return c;
}

TEST(LayerOps, LatentMoeMatchesSglang) {
  Golden g = open_golden("latent_moe_golden.safetensors");
  const TextConfig cfg = tiny_moe_config(g);
  auto ckpt = Checkpoint::open(ops_dir() + "latent_moe");
  ASSERT_TRUE(ckpt) << ckpt.error().message();
  Binder binder(*ckpt);
  MoeBlock moe;
  Status st = moe.bind(binder, "moe.", cfg);
  ASSERT_TRUE(st.is_ok()) << st.message();
#if LAYER_OPS_MUTATE != 5
  EXPECT_TRUE(ckpt->unused().empty()) << "checkpoint tensors not bound: " << ckpt->unused().front();
#endif

  std::vector<int64_t> xshape;
  auto x = g.get<float>("x", DType::kF32, &xshape);
  auto ref_out = g.get<float>("out", DType::kF32);
  auto ref_ids = g.get<int32_t>("topk_ids", DType::kI32);
  auto ref_w = g.get<float>("topk_weights", DType::kF32);
  const int64_t T = xshape[0], H = xshape[1], K = cfg.num_experts_per_token;
  ASSERT_EQ(H, cfg.hidden_size);
  std::printf("[latent_moe] T=%lld, golden min top-k selection gap %s\n", static_cast<long long>(T),
              g.meta("min_selection_gap").c_str());
#if LAYER_OPS_MUTATE == 6
  std::rotate(x.begin(), x.begin() + H, x.end());  // tokens fed in the wrong order
#endif

  std::vector<int> ids;
  std::vector<float> w;
  moe.route(x.data(), T, ids, w);
  ASSERT_EQ(ids.size(), static_cast<size_t>(T * K));
  double worst_w = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i) {
      const size_t k = static_cast<size_t>(t * K + i);
      EXPECT_EQ(ids[k], ref_ids[k]) << "token " << t << " slot " << i;
      worst_w = std::max(worst_w, std::fabs(static_cast<double>(w[k]) - ref_w[k]));
      EXPECT_NEAR(w[k], ref_w[k], 1e-6) << "token " << t << " slot " << i;
    }

  std::vector<float> out(static_cast<size_t>(T * H));
  moe.forward(x.data(), T, out.data());
  double ref_max = 0, worst = 0;
  for (float v : ref_out) ref_max = std::max(ref_max, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(static_cast<double>(out[i]) - ref_out[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-4 * ref_max) << "out[" << i / H << "," << i % H << "]";
  }
  std::printf("[latent_moe] route weights max abs err %.3g; output max err / max|ref| = %.3g (max|ref| %.3g)\n",
              worst_w, worst / ref_max, ref_max);
}

}  // namespace
}  // namespace kestrel
