#!/usr/bin/env python3
"""Op-level goldens for tests/ops/layer_ops_test.cpp, from references INDEPENDENT of our C++.

Writes tests/data/ops/{mxfp4,situ,attn_res,latent_moe_golden}.safetensors and the tiny checkpoint
tests/data/ops/latent_moe/model.safetensors. Deterministic (fixed seeds). Run with
    python tools/gen_op_goldens.py
(needs torch CPU, numpy, safetensors, compressed-tensors 0.20).

Sources transcribed below (third-party code, cited; the few lines are re-typed, not imported, except
compressed-tensors which is imported and called directly):
  [CT]  compressed-tensors 0.20 (installed package):
        compressed_tensors/compressors/mxfp4/base.py   MXFP4PackedCompressor (format "mxfp4-pack-quantized")
        compressed_tensors/compressors/nvfp4/helpers.py pack_fp4_to_uint8, unpack_fp4_from_uint8, kE2M1ToFloat
        compressed_tensors/compressors/mx_utils.py      compress_mx_scale / decompress_mx_scale
  [SG-ACT]  sgl-project/sglang @0099dee6 python/sglang/srt/layers/activation.py  SituAndMul.forward_native
  [SG-AR]   sgl-project/sglang @01fd2332 python/sglang/srt/layers/attn_residual.py aggregate_stream_torch, get_cw
  [SG-K3]   sgl-project/sglang @0000e9b4 python/sglang/srt/models/kimi_k3.py KimiK3MoE (_forward_unfused,
            _reduce_latent, _latent_norm), KimiK3MLP (shared experts)
  [SG-TOPK] sgl-project/sglang @000328a8 python/sglang/srt/layers/moe/topk.py kimi_k2_biased_topk_impl
            (= biased_grouped_topk with num_expert_group=1)
  [SG-NAT]  sgl-project/sglang @163b7981 python/sglang/srt/layers/moe/fused_moe_native.py
            fused_moe_forward_native (einsum form of the routed experts)
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import (
    kE2M1ToFloat,
    pack_fp4_to_uint8,
    unpack_fp4_from_uint8,
)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transcription import transcription_metadata  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "ops")


# ----------------------------------------------------------------------------------------------
# a. MXFP4 (compressed-tensors mxfp4-pack-quantized)
# ----------------------------------------------------------------------------------------------
def gen_mxfp4():
    """Random matrix exactly representable in MXFP4: W[r,c] = E2M1(code) * 2^k(r, c/32).

    Packed with compressed-tensors' own MXFP4PackedCompressor.compress (which quantizes with its own
    FP4 quantizer and packs with pack_fp4_to_uint8: byte j = q[2j] | q[2j+1] << 4) and dequantized with
    its own MXFP4PackedCompressor.decompress (unpack_fp4_from_uint8 + kE2M1ToFloat table +
    decompress_mx_scale). Scale encoding as compressed-tensors stores it for mxfp4-pack-quantized
    (mx_utils.compress_mx_scale): U8 E8M0 biased exponent s = 127 + floor(log2(scale)), i.e.
    scale = 2^(s - 127); no global scale, no zero point (symmetric)."""
    g = torch.Generator().manual_seed(1234)
    out, inn = 48, 256  # 8 groups of 32 per row
    codes = torch.randint(0, 16, (out, inn), generator=g)
    codes[0, :32] = torch.arange(32) % 16  # every code at least once in a known place
    mag = kE2M1ToFloat[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)  # -0.0 for code 8
    # Exponents k in [-20, 20] (s = 107..147): far from E8M0 / bf16 range limits, exact in fp32.
    k = torch.randint(-20, 21, (out, inn // 32), generator=g)
    k[0, 0] = 0  # s = 127 edge: scale exactly 1
    scale = 2.0 ** k.to(torch.float32)
    W = mag * scale.repeat_interleave(32, dim=1)  # fp32, exactly representable

    args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32,
                            symmetric=True, scale_dtype=torch.uint8)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    comp = MXFP4PackedCompressor.compress({"weight": W, "weight_scale": scale}, scheme)
    packed, scale_u8 = comp["weight_packed"], comp["weight_scale"]
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (out, inn // 2)
    assert scale_u8.dtype == torch.uint8 and tuple(scale_u8.shape) == (out, inn // 32)
    assert torch.equal(scale_u8.to(torch.int64), k + 127), "E8M0 encoding is not 127 + log2(scale)"
    # Cross-check: the compressor's packing equals the bare packing function on the exact FP4 values,
    # except for the sign of zero: compress()'s quantizer maps -0.0 to code 0, pack_fp4_to_uint8 keeps
    # the sign bit (code 8). Both are stored; code 8 (= -0) occurs in real checkpoints too.
    packed_bare = pack_fp4_to_uint8(mag)
    lo_b, hi_b = packed_bare & 0xF, packed_bare >> 4
    lo_c, hi_c = packed & 0xF, packed >> 4
    zero_lo = mag[:, 0::2] == 0
    zero_hi = mag[:, 1::2] == 0
    assert torch.equal(lo_c[~zero_lo], lo_b[~zero_lo]) and torch.equal(hi_c[~zero_hi], hi_b[~zero_hi])
    assert bool(((lo_b == 8) | (hi_b == 8)).any()), "no -0 code in the bare packing"

    dec = MXFP4PackedCompressor.decompress(dict(comp), scheme)["weight"]  # bf16 (exact here)
    ref = dec.to(torch.float32)
    assert torch.equal(ref, W), "compressed-tensors round trip not exact"
    # And its bare unpack function agrees with the fp4 values.
    assert torch.equal(unpack_fp4_from_uint8(packed, out, inn, dtype=torch.float32).abs(), mag.abs())

    T = 3
    x = torch.randn(T, inn, generator=g, dtype=torch.float32)
    y64 = x.double() @ ref.double().T  # fp64 reference product
    assert torch.equal(MXFP4PackedCompressor.decompress(
        {"weight_packed": packed_bare, "weight_scale": scale_u8}, scheme)["weight"].float(), W)
    save_file({"packed": packed.contiguous(), "packed_bare": packed_bare.contiguous(), "scale": scale_u8.contiguous(), "ref": ref.contiguous(),
               "x": x, "y_ref_f64": y64.contiguous()},
              os.path.join(OUT, "mxfp4.safetensors"),
              metadata={"source": "compressed-tensors 0.20 MXFP4PackedCompressor compress/decompress",
                        "scale_encoding": "E8M0 u8, scale = 2^(s-127)"})


# ----------------------------------------------------------------------------------------------
# b. SiTU-GLU
# ----------------------------------------------------------------------------------------------
def situ_and_mul(x: torch.Tensor, beta: float, linear_beta) -> torch.Tensor:
    # Transcribed from [SG-ACT] sgl-project/sglang @0099dee6 python/sglang/srt/layers/activation.py,
    # class SituAndMul.forward_native (x = cat([gate, up], -1)).
    d = x.shape[-1] // 2
    gate = x[..., :d].float()
    up = x[..., d:].float()
    gate = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    if linear_beta is not None:
        up = linear_beta * torch.tanh(up / linear_beta)
    return (gate * up).to(x.dtype)


def gen_situ():
    g = torch.Generator().manual_seed(77)
    rows, n = 16, 96
    gate = torch.randn(rows, n, generator=g) * 3.0
    up = torch.randn(rows, n, generator=g) * 10.0
    # Large magnitudes so the soft clipping matters: |x| up to 60 (tanh(60/4), tanh(60/25) regimes).
    gate[:4] = (torch.rand(4, n, generator=g) * 2 - 1) * 60.0
    up[:4] = (torch.rand(4, n, generator=g) * 2 - 1) * 60.0
    gate[4, :8] = torch.tensor([60.0, -60.0, 0.0, -0.0, 1e-3, -1e-3, 20.0, -20.0])
    up[4, :8] = torch.tensor([60.0, -60.0, 30.0, -30.0, 25.0, -25.0, 1e-4, 0.5])
    out = situ_and_mul(torch.cat([gate, up], dim=-1), 4.0, 25.0)
    save_file({"gate": gate.contiguous(), "up": up.contiguous(), "out": out.contiguous()},
              os.path.join(OUT, "situ.safetensors"),
              metadata={"beta": "4.0", "linear_beta": "25.0",
                        "source": "sglang activation.py SituAndMul.forward_native",
                        **transcription_metadata(
                            "sgl-project/sglang@0099dee6 python/sglang/srt/layers/activation.py (SituAndMul.forward_native)",
                            situ_and_mul)})


# ----------------------------------------------------------------------------------------------
# c. Block Attention Residuals
# ----------------------------------------------------------------------------------------------
def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # sglang RMSNorm forward_native form (fp32 variance), docs/model-math.md §2.6.
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(var + eps)).to(x.dtype) * weight


def aggregate_stream_torch(prefix_sum, bank, nvb, proj_w, norm_w, eps):
    # Transcribed from [SG-AR] sgl-project/sglang @01fd2332 python/sglang/srt/layers/attn_residual.py,
    # aggregate_stream_torch; score_norm = RMSNorm(norm_w, eps), score_proj = ReplicatedLinear [1, H].
    if nvb == 0:
        return prefix_sum
    T, H = prefix_sum.shape
    rows = torch.cat([bank[:, :nvb, :], prefix_sum.unsqueeze(1)], dim=1)
    R = nvb + 1
    normed = rms_norm_ref(rows.reshape(T * R, H), norm_w, eps)
    scores = F.linear(normed, proj_w).reshape(T, R)
    probs = torch.softmax(scores.float(), dim=-1)
    mixed = (probs.unsqueeze(-1) * rows.float()).sum(dim=1)
    return mixed.to(prefix_sum.dtype)


def gen_attn_res():
    g = torch.Generator().manual_seed(4242)
    D, eps = 256, 1e-5
    tensors = {}
    cases = [(1, 3), (2, 4), (3, 2), (5, 3), (9, 5)]  # (n sources incl. prefix, T)
    for ci, (n, T) in enumerate(cases):
        nvb = n - 1
        # Rows at very different scales (as block sums are), so the row RMS normalisation matters.
        scales = torch.tensor([0.05, 1.0, 7.0, 0.3, 20.0, 2.0, 0.8, 3.0, 0.1])[:n]
        rows = torch.randn(T, n, D, generator=g) * scales.view(1, n, 1)
        bank, prefix = rows[:, :nvb, :].contiguous(), rows[:, nvb, :].contiguous()
        norm_w = 1.0 + 0.3 * torch.randn(D, generator=g)
        proj_w = 0.08 * torch.randn(1, D, generator=g)
        # get_cw: c = norm.weight.float() * proj.weight.squeeze().float()   [SG-AR]
        c = (norm_w.float() * proj_w.squeeze().float()).contiguous()
        out = aggregate_stream_torch(prefix, bank, nvb, proj_w, norm_w, eps)
        tensors[f"case{ci}.rows"] = rows.permute(1, 0, 2).contiguous()  # [n, T, D]; row n-1 = prefix
        tensors[f"case{ci}.c"] = c
        tensors[f"case{ci}.out"] = out.clone().contiguous()
    save_file(tensors, os.path.join(OUT, "attn_res.safetensors"),
              metadata={"num_cases": str(len(cases)), "eps": str(eps),
                        "source": "sglang attn_residual.py aggregate_stream_torch",
                        **transcription_metadata(
                            "sgl-project/sglang@01fd2332 python/sglang/srt/layers/attn_residual.py "
                            "(aggregate_stream_torch, get_cw); RMSNorm.forward_native form", aggregate_stream_torch,
                            rms_norm_ref)})


# ----------------------------------------------------------------------------------------------
# d. LatentMoE
# ----------------------------------------------------------------------------------------------
def biased_topk(gating_output, correction_bias, topk, renormalize, routed_scaling_factor):
    # Transcribed from [SG-TOPK] sgl-project/sglang @000328a8 python/sglang/srt/layers/moe/topk.py,
    # kimi_k2_biased_topk_impl (the num_expert_group == 1 form of biased_grouped_topk_impl).
    # sglang's renormalisation has no eps (HF modeling adds 1e-20, far below fp32 resolution of an
    # O(1) sum). The scaling factor: sglang applies it here when apply_routed_scaling_factor_on_output,
    # else the experts layer multiplies its output by it -- the same product; we fold it into weights.
    scores = gating_output.sigmoid()
    num_token = scores.shape[0]
    tmp_scores = scores.view(num_token, -1) + correction_bias.unsqueeze(0)
    _, topk_ids = torch.topk(tmp_scores, k=topk, dim=-1, sorted=True)  # sorted for stable id lists
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights_sum = topk_weights.sum(dim=-1, keepdim=True)
        topk_weights = topk_weights / topk_weights_sum
    topk_weights = topk_weights * routed_scaling_factor
    return topk_weights.to(torch.float32), topk_ids.to(torch.int32), tmp_scores


def routed_experts(x, topk_weights, topk_ids, w13_weight, w2_weight, beta, linear_beta):
    # Transcribed from [SG-NAT] sgl-project/sglang @163b7981 python/sglang/srt/layers/moe/
    # fused_moe_native.py fused_moe_forward_native (einsum form); its silu/gelu branch replaced by the
    # K3 activation SituAndMul on cat(x1, x3) ([SG-K3] passes activation=config.hidden_act="situ").
    w13_weights = w13_weight[topk_ids.long()]
    w1_weights, w3_weights = torch.chunk(w13_weights, 2, dim=2)
    w2_weights = w2_weight[topk_ids.long()]
    x1 = torch.einsum("ti,taoi -> tao", x, w1_weights)
    x3 = torch.einsum("ti, taoi -> tao", x, w3_weights)
    act = situ_and_mul(torch.cat([x1, x3], dim=-1), beta, linear_beta)
    expert_outs = torch.einsum("tao, taio -> tai", act, w2_weights)
    return torch.einsum("tai,ta -> ti", expert_outs, topk_weights.to(expert_outs.dtype))


def kimi_k3_moe_forward(x, W, cfg):
    # Transcribed from [SG-K3] KimiK3MoE._forward_unfused (single rank: no all-reduce):
    #   router_logits = self.gate(hidden_states)           (MoEGate, fp32 logits)
    #   topk_output = self.topk(hidden_states, router_logits)
    #   shared_output = self.shared_experts(hidden_states)  (KimiK3MLP: down(SituAndMul(gate_up(x))))
    #   routed_input, _ = self.routed_expert_down_proj(hidden_states)
    #   expert_output = self.experts(routed_input, topk_output)
    #   latent = self._reduce_latent(expert_output)       (= routed_expert_norm(latent), AFTER the sum)
    #   out, _ = self.routed_expert_up_proj(latent)
    #   return out + shared_output
    beta, lbeta = cfg["situ_beta"], cfg["situ_linear_beta"]
    router_logits = F.linear(x.float(), W["gate"].float())
    topk_w, topk_ids, sel = biased_topk(router_logits, W["bias"], cfg["top_k"], True, cfg["rsf"])
    gu = F.linear(x, torch.cat([W["sh_gate"], W["sh_up"]], dim=0))
    shared_output = F.linear(situ_and_mul(gu, beta, lbeta), W["sh_down"])
    routed_input = F.linear(x, W["lat_down"])
    expert_output = routed_experts(routed_input, topk_w, topk_ids, W["w13"], W["w2"], beta, lbeta)
    latent = rms_norm_ref(expert_output, W["lat_norm"], cfg["eps"])
    out = F.linear(latent, W["lat_up"])
    return out + shared_output, topk_w, topk_ids, sel


def bf16(t):
    return t.to(torch.bfloat16)


def gen_latent_moe():
    g = torch.Generator().manual_seed(2026)
    H, L, I, E, K, S, T = 64, 32, 32, 8, 4, 2, 5
    cfg = {"situ_beta": 4.0, "situ_linear_beta": 25.0, "top_k": K, "rsf": 2.5, "eps": 1e-5}

    def rnd(*shape, std):
        return torch.randn(*shape, generator=g) * std

    # Checkpoint tensors (bf16 except the bias); the reference uses exactly these values in fp32.
    ck = {
        "moe.gate.weight": bf16(rnd(E, H, std=0.25)),
        "moe.gate.e_score_correction_bias": (rnd(E, std=0.05)).float(),
        "moe.routed_expert_down_proj.weight": bf16(rnd(L, H, std=H ** -0.5)),
        "moe.routed_expert_norm.weight": bf16(1.0 + 0.2 * rnd(L, std=1.0)),
        "moe.routed_expert_up_proj.weight": bf16(rnd(H, L, std=L ** -0.5)),
        "moe.shared_experts.gate_proj.weight": bf16(rnd(S * I, H, std=0.5)),
        "moe.shared_experts.up_proj.weight": bf16(rnd(S * I, H, std=0.5)),
        "moe.shared_experts.down_proj.weight": bf16(rnd(H, S * I, std=(S * I) ** -0.5)),
    }
    for e in range(E):
        # std 1 on w1/w3 with unit-RMS latent input: pre-activations reach |x| ~ 10+, so both tanh
        # clips of SiTU are exercised inside the block.
        ck[f"moe.experts.{e}.w1.weight"] = bf16(rnd(I, L, std=1.5))
        ck[f"moe.experts.{e}.w3.weight"] = bf16(rnd(I, L, std=1.5))
        ck[f"moe.experts.{e}.w2.weight"] = bf16(rnd(L, I, std=I ** -0.5))

    f = lambda n: ck[n].float()
    W = {
        "gate": f("moe.gate.weight"), "bias": f("moe.gate.e_score_correction_bias"),
        "lat_down": f("moe.routed_expert_down_proj.weight"), "lat_norm": f("moe.routed_expert_norm.weight"),
        "lat_up": f("moe.routed_expert_up_proj.weight"),
        "sh_gate": f("moe.shared_experts.gate_proj.weight"), "sh_up": f("moe.shared_experts.up_proj.weight"),
        "sh_down": f("moe.shared_experts.down_proj.weight"),
        # FusedMoE layout: w13 [E, 2I, L] = cat(w1, w3), w2 [E, L, I]  (gate_up_interleaved=False)
        "w13": torch.stack([torch.cat([f(f"moe.experts.{e}.w1.weight"), f(f"moe.experts.{e}.w3.weight")], 0)
                            for e in range(E)]),
        "w2": torch.stack([f(f"moe.experts.{e}.w2.weight") for e in range(E)]),
    }

    # Inputs: draw token rows until every token's selection has no near-tie at the top-k boundary
    # (nor inside the top-k, so the sorted id list is stable): gap >= 2e-3 vs fp32 logit error ~1e-6.
    rows = []
    while len(rows) < T:
        xt = torch.randn(1, H, generator=g)
        logits = F.linear(xt, W["gate"])
        sel = (logits.sigmoid() + W["bias"]).squeeze(0)
        s = torch.sort(sel, descending=True).values
        if torch.min(s[:K] - s[1:K + 1]).item() >= 2e-3:
            rows.append(xt)
    x = torch.cat(rows, 0).contiguous()

    out, topk_w, topk_ids, sel = kimi_k3_moe_forward(x, W, cfg)
    s = torch.sort(sel, dim=-1, descending=True).values
    min_gap = torch.min(s[:, :K] - s[:, 1:K + 1]).item()

    os.makedirs(os.path.join(OUT, "latent_moe"), exist_ok=True)
    save_file({k: v.contiguous() for k, v in ck.items()}, os.path.join(OUT, "latent_moe", "model.safetensors"))
    save_file({"x": x, "out": out.contiguous(), "topk_ids": topk_ids.contiguous(),
               "topk_weights": topk_w.contiguous()},
              os.path.join(OUT, "latent_moe_golden.safetensors"),
              metadata={"H": str(H), "L": str(L), "I": str(I), "E": str(E), "top_k": str(K),
                        "num_shared_experts": str(S), "routed_scaling_factor": str(cfg["rsf"]),
                        "rms_norm_eps": str(cfg["eps"]), "situ_beta": "4.0", "situ_linear_beta": "25.0",
                        "min_selection_gap": f"{min_gap:.6g}",
                        "source": "sglang kimi_k3.py KimiK3MoE._forward_unfused + topk.py + fused_moe_native.py",
                        **transcription_metadata(
                            "sgl-project/sglang@0000e9b4 python/sglang/srt/models/kimi_k3.py (KimiK3MoE), "
                            "@000328a8 python/sglang/srt/layers/moe/topk.py (kimi_k2_biased_topk_impl), "
                            "@163b7981 python/sglang/srt/layers/moe/fused_moe_native.py (fused_moe_forward_native), "
                            "@0099dee6 python/sglang/srt/layers/activation.py (SituAndMul.forward_native)",
                            kimi_k3_moe_forward, biased_topk, routed_experts, situ_and_mul, rms_norm_ref)})
    return min_gap


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    gen_mxfp4()
    gen_situ()
    gen_attn_res()
    gap = gen_latent_moe()
    total = 0
    for dp, _, fs in os.walk(OUT):
        for fn in fs:
            total += os.path.getsize(os.path.join(dp, fn))
    print(f"wrote goldens to {OUT}: {total} bytes; LatentMoE min top-k selection gap {gap:.4g}")
    assert total < 1 << 20


if __name__ == "__main__":
    sys.exit(main())
