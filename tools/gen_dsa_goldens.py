#!/usr/bin/env python3
"""Goldens for the DSA lightning indexer and sparse MLA (src/kernels/cpu/dsa_indexer.h,
src/layers/dsa_indexer.h), from a PyTorch-on-CPU transcription of DeepSeek's reference.

Run with the project venv:  python tools/gen_dsa_goldens.py [--out tests/data/dsa]

Reference transcribed (semantics, not code copied into the engine):
  github.com/deepseek-ai/DeepSeek-V3.2-Exp @3b99a53 inference/model.py
    Indexer.forward (wq_b on the MLA q latent, rope-first split, LayerNorm(wk x), Hadamard
    rotate_activation, act_quant of q and k, weights_proj · n_heads^-0.5 · q_scale · head_dim^-0.5,
    fp8_index, causal mask, topk(min(index_topk, end_pos))) and MLA.forward's index mask;
  inference/kernel.py act_quant_kernel (amax ≥ 1e-4, s = amax/448, ue8m0 → 2^ceil(log2 s),
    clamp ±448, cast e4m3fn) and fp8_index_kernel (ReLU(q8·k8) · q_s summed over heads, · k_s);
  plus the 2025-11-17 fix (docs/model-math.md §6.3 step 3): indexer RoPE is NON-interleaved (NeoX,
    pairs (i, i + rope/2)); weights_proj computed in fp32.
Deliberate differences from the demo, all documented in the engine: everything runs in fp32 (the
engine's activation dtype) instead of bf16 before quantization; the Hadamard transform is applied as
an explicit Sylvester matrix (not the fast_hadamard_transform CUDA kernel); RoPE uses plain
frequencies theta^(-2i/rope) (K3 has no YaRN block; the DSA template for K3 is ours).
The sparse attention reference is the reference's absorbed ("MHA decode") path: dense scores over
all cached latents + the index mask (−inf outside the selected set) + causal mask, softmax, values =
the first kv_lora entries. The engine instead gathers only the selected rows.

Files (all tensors fp32 unless noted; T = prefill + decode tokens, one sequence):
  case 'indexer': x [T,hid], qr [T,q_lora], wq_b [H*D,q_lora], wk [D,hid], k_norm_w/b [D],
    weights_proj [H,hid], inv_freq [rope/2], q_pre [T,H,D] / k_pre [T,D] (after RoPE + Hadamard, before
    quant), q_codes [T,H,D] u8 / q_scale [T,H], k_codes [T,D] u8 / k_scale [T], weights [T,H] (folded),
    scores [T,T] (row t: keys 0..t; −inf above the diagonal), selected [T,T] u8 (1 = position in the
    row's final index set), then attention: q_lat [T,Ha,Dk], kv [T,Dk], out_sparse [T,Ha,Dv],
    out_dense [T,Ha,Dv]. metadata: sizes, topk, prefill length, ue8m0, scale.
  case 'indexer_bigk': same with index_topk ≥ T (DSA must equal dense MLA).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transcription import transcription_metadata  # noqa: E402

UPSTREAM = ("deepseek-ai/DeepSeek-V3.2-Exp@3b99a53 inference/model.py (Indexer.forward, MLA index mask), "
            "inference/kernel.py (act_quant_kernel, fp8_index_kernel), with the 2025-11-17 NeoX indexer RoPE fix")

BLOCK = 128


def act_quant(x: torch.Tensor, scale_fmt):
    """kernel.py act_quant_kernel, emulated: per 128-block amax, scale, clamp, cast e4m3fn."""
    shp = x.shape
    xb = x.float().reshape(-1, shp[-1] // BLOCK, BLOCK)
    amax = xb.abs().amax(-1).clamp_min(1e-4)
    s = amax * (1.0 / 448.0)
    if scale_fmt is not None:  # fast_round_scale: 2^ceil(log2(s)) from the fp32 bits
        bits = s.view(torch.int32)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & ((1 << 23) - 1)) != 0).to(torch.int32)
        s = torch.pow(2.0, e.float())
    y = (xb / s.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return y.reshape(shp), s.reshape(*shp[:-1], shp[-1] // BLOCK)


def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotate_activation(x: torch.Tensor) -> torch.Tensor:
    """hadamard_transform(x, scale=d^-0.5) as an explicit orthonormal matrix product (fp64 then fp32)."""
    d = x.shape[-1]
    return (x.double() @ sylvester(d).T * d ** -0.5).float()


def apply_rotary_emb_neox(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """The fixed (non-interleaved) indexer RoPE: de-interleave halves, rotate as complex pairs, re-split."""
    shape = x.shape
    xp = x.float().view(*shape[:-1], 2, -1).transpose(-1, -2).contiguous()
    xc = torch.view_as_complex(xp.view(*shape[:-1], -1, 2))
    fc = freqs_cis  # [rope/2] for this token's position; broadcasts over heads
    y = torch.view_as_real(xc * fc).flatten(-2)
    return torch.cat([y[..., 0::2], y[..., 1::2]], dim=-1)


class Indexer:
    def __init__(self, g, hid, q_lora, H, D, rope, topk, theta, scale_fmt):
        self.H, self.D, self.rope, self.topk, self.scale_fmt = H, D, rope, topk, scale_fmt
        self.wq_b = torch.randn(H * D, q_lora, generator=g) * q_lora ** -0.5
        self.wk = torch.randn(D, hid, generator=g) * hid ** -0.5
        self.k_norm_w = 1.0 + 0.1 * torch.randn(D, generator=g)
        self.k_norm_b = 0.1 * torch.randn(D, generator=g)
        self.weights_proj = torch.randn(H, hid, generator=g) * hid ** -0.5
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rope, 2, dtype=torch.float32) / rope))
        self.k_cache = []   # fp8 codes per position
        self.ks_cache = []
        self.dbg = {k: [] for k in ("q_pre", "k_pre", "q_codes", "q_scale", "k_codes", "k_scale", "weights")}

    def freqs(self, start, n):
        t = torch.arange(start, start + n, dtype=torch.float32)
        return torch.polar(torch.ones(n, self.rope // 2), torch.outer(t, self.inv_freq))

    def forward(self, x, qr, start_pos, mask):
        """x [S,hid], qr [S,q_lora] (batch 1 squeezed); returns (scores [S,end_pos], topk indices)."""
        S = x.shape[0]
        end_pos = start_pos + S
        fc = self.freqs(start_pos, S)
        q = (qr @ self.wq_b.T).view(S, self.H, self.D)
        q_pe, q_nope = torch.split(q, [self.rope, self.D - self.rope], dim=-1)
        q_pe = torch.stack([apply_rotary_emb_neox(q_pe[s], fc[s]) for s in range(S)])
        q = torch.cat([q_pe, q_nope], -1)
        k = F.layer_norm(x @ self.wk.T, (self.D,), self.k_norm_w, self.k_norm_b, 1e-6)
        k_pe, k_nope = torch.split(k, [self.rope, self.D - self.rope], dim=-1)
        k_pe = torch.stack([apply_rotary_emb_neox(k_pe[s], fc[s]) for s in range(S)])
        k = torch.cat([k_pe, k_nope], -1)
        q = rotate_activation(q)
        k = rotate_activation(k)
        q_fp8, q_scale = act_quant(q, self.scale_fmt)
        k_fp8, k_scale = act_quant(k, self.scale_fmt)
        for s in range(S):
            self.k_cache.append(k_fp8[s])
            self.ks_cache.append(k_scale[s])
        weights = (x.float() @ self.weights_proj.T) * self.H ** -0.5
        weights = weights.unsqueeze(-1) * q_scale * self.D ** -0.5  # [S,H,1]
        kc = torch.stack(self.k_cache[:end_pos]).float()              # [end_pos, D]
        kcs = torch.stack(self.ks_cache[:end_pos]).float()            # [end_pos, 1]
        # fp8_index: logits = q8·k8 (fp32 accumulate), ReLU, × weights, Σ_h, × k_scale.
        logits = torch.einsum("shd,td->sht", q_fp8.float(), kc)
        score = (logits.clamp_min(0) * weights).sum(1) * kcs[:, 0].unsqueeze(0)
        if mask is not None:
            score = score + mask
        idx = score.topk(min(self.topk, end_pos), dim=-1)[1]
        for name, v in (("q_pre", q), ("k_pre", k), ("q_codes", q_fp8.view(torch.uint8)),
                        ("q_scale", q_scale[..., 0]), ("k_codes", k_fp8.view(torch.uint8)),
                        ("k_scale", k_scale[..., 0]), ("weights", weights[..., 0])):
            self.dbg[name].append(v)
        return score, idx


def make_case(name, out_dir, topk, seed=7):
    g = torch.Generator().manual_seed(seed)
    hid, q_lora, H, D, rope, T0, n_dec = 64, 48, 4, 128, 64, 40, 4
    Ha, lora, dr = 3, 128, 32
    Dk, Dv = lora + dr, lora
    T = T0 + n_dec
    idx = Indexer(g, hid, q_lora, H, D, rope, topk, 10000.0, "ue8m0")
    x = torch.randn(T, hid, generator=g)
    qr = torch.randn(T, q_lora, generator=g)
    scores = torch.full((T, T), float("-inf"))
    selected = torch.zeros(T, T, dtype=torch.uint8)
    # Prefill (start_pos 0, causal mask) then single-token decode steps, as the reference runs them.
    mask = torch.full((T0, T0), float("-inf")).triu_(1)
    sc, ix = idx.forward(x[:T0], qr[:T0], 0, mask)
    index_mask = torch.full((T0, T0), float("-inf")).scatter_(-1, ix, 0) + mask
    scores[:T0, :T0] = sc
    selected[:T0, :T0] = (index_mask == 0).to(torch.uint8)
    for t in range(T0, T):
        sc, ix = idx.forward(x[t:t + 1], qr[t:t + 1], t, None)
        scores[t, :t + 1] = sc[0]
        selected[t, ix[0]] = 1
    # Sparse MLA (absorbed/MQA form): q_lat [T,Ha,Dk], latent rows kv [T,Dk], values kv[:, :lora].
    q_lat = torch.randn(T, Ha, Dk, generator=g)
    kv = torch.randn(T, Dk, generator=g)
    scale = (128 + 64) ** -0.5
    s_all = torch.einsum("thc,jc->thj", q_lat.double(), kv.double()) * scale
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu_(1)
    imask = torch.where(selected.bool(), 0.0, float("-inf")).double()
    out_sparse = torch.einsum("thj,jc->thc", (s_all + imask.unsqueeze(1)).softmax(-1), kv[:, :Dv].double())
    out_dense = torch.einsum("thj,jc->thc", (s_all + causal.unsqueeze(1)).softmax(-1), kv[:, :Dv].double())
    t = {
        "x": x, "qr": qr, "wq_b": idx.wq_b, "wk": idx.wk, "k_norm_w": idx.k_norm_w, "k_norm_b": idx.k_norm_b,
        "weights_proj": idx.weights_proj, "inv_freq": idx.inv_freq,
        "scores": scores, "selected": selected,
        "q_lat": q_lat, "kv": kv, "out_sparse": out_sparse.float(), "out_dense": out_dense.float(),
    }
    for k, v in idx.dbg.items():
        t[k] = torch.cat(v, 0).contiguous()
    meta = {"hid": hid, "q_lora": q_lora, "H": H, "D": D, "rope": rope, "topk": topk, "T": T, "prefill": T0,
            "Ha": Ha, "Dk": Dk, "Dv": Dv, "scale": repr(scale), "ue8m0": "1", "theta": "10000",
            "reference": "deepseek-ai/DeepSeek-V3.2-Exp@3b99a53 inference/{model,kernel}.py + 2025-11-17 NeoX indexer RoPE fix",
            "torch": torch.__version__}
    meta.update(transcription_metadata(UPSTREAM, *TRANSCRIBED))
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out_dir, name + ".safetensors"),
              metadata={k: str(v) for k, v in meta.items()})
    n_sel = selected.sum(1)
    print(name, "selected per row (min/max):", int(n_sel.min()), int(n_sel.max()))


# The transcription of the reference (hashed into every golden's metadata); make_case holds the sparse
# attention reference (dense scores + index mask, softmax).
TRANSCRIBED = (act_quant, sylvester, rotate_activation, apply_rotary_emb_neox, Indexer, make_case)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "dsa"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    make_case("indexer", a.out, topk=12)
    make_case("indexer_bigk", a.out, topk=64)


if __name__ == "__main__":
    main()
