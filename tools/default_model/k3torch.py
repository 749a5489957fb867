"""A small Kimi K3 text model in PyTorch with the same forward math as Kestrel (docs/model-math.md §2, §3).

Layers, as src/models/kimi_model.cpp and src/layers/*.cpp compute them:
  * Block Attention Residuals (§2.1): a bank of frozen block sums, softmax over depth of the raw rows scored by
    (norm.weight * proj.weight) . rows / rms(rows); block boundaries at l % attn_res_block == 0.
  * KDA (§2.2, §3): q/k/v projections, causal depthwise conv (kernel 4) + SiLU, per-head L2 norm (eps 1e-6 inside
    the sqrt), query scale head_dim^-0.5, bounded decay gate g = -5 * sigmoid(exp(A_log[h]) * (f + dt_bias)),
    beta = sigmoid(b_proj x), delta-rule recurrence, per-head RMSNorm(o_norm) * sigmoid(g_proj x), o_proj.
  * Gated NoPE MLA (§2.3): q = q_b(RMSNorm(q_a x)), [c_kv | k_r] = kv_a x, c_kv normed, [k_nope | v] = kv_b c_kv,
    no rotary, softmax scale (nope + rope)^-0.5, output * sigmoid(g_proj x), o_proj.
  * Dense layer 0 and LatentMoE with shared experts (§2.4): sigmoid router, top-k on score + correction bias,
    renormalised weights, experts in the latent width, RMSNorm of the weighted sum, latent up + shared experts.
  * SiTU-GLU everywhere (§2.5): 4 tanh(g/4) sigmoid(g) * 25 tanh(u/25).
  * Every RMSNorm: x * rsqrt(mean(x^2) + 1e-5) * w.

`chunk_kda` is an exact vectorised form of the chunked delta rule (§3.6, any chunk size); `recurrent_kda` the
token-by-token definition (§3.5). tools/default_model/check_kda.py compares both with fla-core's naive kernels.
"""
import dataclasses
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5


@dataclasses.dataclass
class Config:
    vocab: int = 6144          # ranks + 256 K3 specials
    hidden: int = 384
    layers: int = 8
    full_attn_layers: tuple = (4, 8)   # one-based MLA layers (K3's 3:1 pattern)
    attn_res_block: int = 4
    kda_heads: int = 6
    head_dim: int = 64
    mla_heads: int = 6
    q_lora: int = 128
    kv_lora: int = 128
    nope: int = 64
    rope: int = 32
    v_dim: int = 64
    intermediate: int = 1024   # dense layer 0
    experts: int = 16
    top_k: int = 4
    shared: int = 2            # shared experts, fused: width shared * moe_inter
    moe_inter: int = 192
    latent: int = 192
    gate_lower_bound: float = -5.0

    def is_mla(self, l):
        return (l + 1) in self.full_attn_layers

    def to_json(self):
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(s):
        d = json.loads(s)
        d["full_attn_layers"] = tuple(d["full_attn_layers"])
        return Config(**d)


def rms_norm(x, w, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def situ(g, u, beta=4.0, beta_lin=25.0):
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (beta_lin * torch.tanh(u / beta_lin))


def l2norm(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_kda(q, k, v, g, beta, scale):
    """q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]. Definition (§3.5), zero initial state."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        p = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + k[:, t][..., None] * (beta[:, t][..., None] * (v[:, t] - p))[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(out, 1)


def chunk_kda(q, k, v, g, beta, scale, C=16):
    """Chunked delta rule (§3.6), vectorised over chunks; exact for any C. Shapes as recurrent_kda."""
    B, T, H, K = q.shape
    Vd = v.shape[-1]
    pad = (-T) % C
    if pad:  # q = k = v = 0, g = 0, beta = 0 keeps the outputs of the real tokens exact
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // C
    r = lambda x: x.reshape(B, N, C, H, -1).transpose(2, 3)  # [B,N,H,C,*]
    q, k, v, g = r(q) * scale, r(k), r(v), r(g)
    beta = beta.reshape(B, N, C, H).transpose(2, 3)            # [B,N,H,C]
    G = g.cumsum(-2)
    diff = G[..., :, None, :] - G[..., None, :, :]             # [B,N,H,C(r),C(j),K]
    incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    strict = torch.tril(incl, diagonal=-1)
    E = diff.masked_fill(~incl[..., None], float("-inf")).exp()
    Akk = (k[..., :, None, :] * k[..., None, :, :] * E).sum(-1) * beta[..., None]
    Akk = Akk.masked_fill(~strict, 0.0)
    Aqk = (q[..., :, None, :] * k[..., None, :, :] * E).sum(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + Akk, torch.diag_embed(beta), upper=False)
    W = Tm @ (G.exp() * k)
    U = Tm @ v
    S = q.new_zeros(B, H, K, Vd)
    outs = []
    for n in range(N):
        Vp = U[:, n] - W[:, n] @ S
        outs.append((q[:, n] * G[:, n].exp()) @ S + Aqk[:, n] @ Vp)
        last = G[:, n, :, -1]                                   # [B,H,K]
        S = last.exp()[..., None] * S + ((last[:, :, None, :] - G[:, n]).exp() * k[:, n]).transpose(-1, -2) @ Vp
    o = torch.stack(outs, 1).transpose(2, 3).reshape(B, N * C, H, Vd)
    return o[:, :T]


class KDA(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        H, D = c.kda_heads, c.head_dim
        P = H * D
        self.c, self.H, self.D, self.P = c, H, D, P
        lin = lambda o, i: nn.Linear(i, o, bias=False)
        self.q_proj, self.k_proj, self.v_proj = lin(P, c.hidden), lin(P, c.hidden), lin(P, c.hidden)
        bound = 1 / math.sqrt(4)  # PyTorch's conv1d default init for kernel 4, one input channel per group
        self.q_conv1d = nn.Parameter(torch.empty(P, 1, 4).uniform_(-bound, bound))
        self.k_conv1d = nn.Parameter(torch.empty(P, 1, 4).uniform_(-bound, bound))
        self.v_conv1d = nn.Parameter(torch.empty(P, 1, 4).uniform_(-bound, bound))
        self.f_a_proj, self.f_b_proj = lin(D, c.hidden), lin(P, D)
        self.b_proj = lin(H, c.hidden)
        dt = torch.exp(torch.rand(P) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        a = torch.zeros(max(D, H))
        a[:H] = torch.log(torch.empty(H).uniform_(1, 16))
        self.A_log = nn.Parameter(a)  # released K3 layout: padded to max(head_dim, heads), first H used
        self.o_norm = nn.Parameter(torch.ones(D))
        self.g_proj = lin(P, c.hidden)
        self.o_proj = lin(c.hidden, P)

    def conv(self, x, w):
        T = x.shape[1]
        y = F.conv1d(x.transpose(1, 2), w, padding=3, groups=self.P)[..., :T]
        return F.silu(y.transpose(1, 2))

    def forward(self, x, kernel="chunk"):
        B, T, _ = x.shape
        H, D = self.H, self.D
        q = l2norm(self.conv(self.q_proj(x), self.q_conv1d).reshape(B, T, H, D))
        k = l2norm(self.conv(self.k_proj(x), self.k_conv1d).reshape(B, T, H, D))
        v = self.conv(self.v_proj(x), self.v_conv1d).reshape(B, T, H, D)
        f = self.f_b_proj(self.f_a_proj(x)) + self.dt_bias
        a = self.A_log[:H].exp().repeat_interleave(D)
        g = (self.c.gate_lower_bound * torch.sigmoid(a * f)).reshape(B, T, H, D)
        beta = torch.sigmoid(self.b_proj(x))
        scale = D ** -0.5
        if kernel == "chunk":
            o = chunk_kda(q, k, v, g, beta, scale)
        elif kernel == "recurrent":
            o = recurrent_kda(q, k, v, g, beta, scale)
        else:  # a callable with fla's naive signature
            o = kernel(q, k, v, g, beta, scale)
        o = rms_norm(o, self.o_norm) * torch.sigmoid(self.g_proj(x).reshape(B, T, H, D))
        return self.o_proj(o.reshape(B, T, H * D))


class MLA(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        nh, qk = c.mla_heads, c.nope + c.rope
        lin = lambda o, i: nn.Linear(i, o, bias=False)
        self.q_a_proj = lin(c.q_lora, c.hidden)
        self.q_a_layernorm = nn.Parameter(torch.ones(c.q_lora))
        self.q_b_proj = lin(nh * qk, c.q_lora)
        self.kv_a_proj_with_mqa = lin(c.kv_lora + c.rope, c.hidden)
        self.kv_a_layernorm = nn.Parameter(torch.ones(c.kv_lora))
        self.kv_b_proj = lin(nh * (c.nope + c.v_dim), c.kv_lora)
        self.g_proj = lin(nh * c.v_dim, c.hidden)
        self.o_proj = lin(c.hidden, nh * c.v_dim)

    def forward(self, x, kernel=None):
        c = self.c
        B, T, _ = x.shape
        nh = c.mla_heads
        q = self.q_b_proj(rms_norm(self.q_a_proj(x), self.q_a_layernorm)).reshape(B, T, nh, c.nope + c.rope)
        ckv = self.kv_a_proj_with_mqa(x)
        lat = rms_norm(ckv[..., :c.kv_lora], self.kv_a_layernorm)
        k_r = ckv[..., c.kv_lora:]
        kv = self.kv_b_proj(lat).reshape(B, T, nh, c.nope + c.v_dim)
        k = torch.cat([kv[..., :c.nope], k_r[:, :, None, :].expand(B, T, nh, c.rope)], -1)
        v = kv[..., c.nope:]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=(c.nope + c.rope) ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, nh * c.v_dim)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x)))


class GatedMlp(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x)))


class LatentMoE(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        E, I, L = c.experts, c.moe_inter, c.latent
        self.gate = nn.Linear(c.hidden, E, bias=False)
        self.register_buffer("e_score_correction_bias", torch.zeros(E))
        self.routed_expert_down_proj = nn.Linear(c.hidden, L, bias=False)
        self.routed_expert_norm = nn.Parameter(torch.ones(L))
        self.routed_expert_up_proj = nn.Linear(L, c.hidden, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, I, L) * 0.02)  # gate   [E, out, in]
        self.w3 = nn.Parameter(torch.randn(E, I, L) * 0.02)  # up
        self.w2 = nn.Parameter(torch.randn(E, L, I) * 0.02)  # down
        self.shared_experts = GatedMlp(c.hidden, c.shared * I)
        self.last_load = None

    def forward(self, x):
        c = self.c
        s = torch.sigmoid(self.gate(x))                          # [B,T,E]
        idx = torch.topk(s + self.e_score_correction_bias, c.top_k, dim=-1).indices
        w = s.gather(-1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
        dense_w = torch.zeros_like(s).scatter(-1, idx, w)       # [B,T,E]
        if self.training:
            self.last_load = torch.zeros_like(s).scatter(-1, idx, 1.0).mean((0, 1)).detach()
        z = self.routed_expert_down_proj(x)                      # [B,T,L]
        if self.training:  # every expert on every token (small model), weights zero off the top-k
            h = situ(torch.einsum("btl,eil->btei", z, self.w1), torch.einsum("btl,eil->btei", z, self.w3))
            y = torch.einsum("btei,eli,bte->btl", h, self.w2, dense_w)
        else:  # only the selected experts (same result, less work)
            y = torch.zeros_like(z)
            for e in range(c.experts):
                sel = dense_w[..., e] != 0
                if sel.any():
                    ze = z[sel]
                    he = situ(ze @ self.w1[e].T, ze @ self.w3[e].T) @ self.w2[e].T
                    y[sel] += dense_w[..., e][sel][:, None] * he
        y = rms_norm(y, self.routed_expert_norm)
        return self.routed_expert_up_proj(y) + self.shared_experts(x)


class Layer(nn.Module):
    def __init__(self, c: Config, l: int):
        super().__init__()
        D = c.hidden
        self.input_layernorm = nn.Parameter(torch.ones(D))
        self.post_attention_layernorm = nn.Parameter(torch.ones(D))
        self.self_attention_res_norm = nn.Parameter(torch.ones(D))
        self.self_attention_res_proj = nn.Parameter(torch.zeros(1, D))
        self.mlp_res_norm = nn.Parameter(torch.ones(D))
        self.mlp_res_proj = nn.Parameter(torch.zeros(1, D))
        self.self_attn = MLA(c) if c.is_mla(l) else KDA(c)
        self.mlp = GatedMlp(D, c.intermediate) if l == 0 else LatentMoE(c)


def attn_res(rows, norm_w, proj_w, eps=EPS):
    R = torch.stack(rows, 0)                                     # [n,B,T,D]
    cw = norm_w * proj_w[0]
    s = (R * cw).sum(-1) / torch.sqrt(R.pow(2).mean(-1) + eps)   # [n,B,T]
    p = torch.softmax(s, 0)
    return (p[..., None] * R).sum(0)


class K3Model(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList([Layer(c, l) for l in range(c.layers)])
        self.norm = nn.Parameter(torch.ones(c.hidden))
        self.output_attn_res_norm = nn.Parameter(torch.ones(c.hidden))
        self.output_attn_res_proj = nn.Parameter(torch.zeros(1, c.hidden))
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        self._init()

    def _init(self):
        # Embedding N(0, 1) (AttnRes mixes raw rows); matrices N(0, 0.02); projections that write into the
        # residual stream N(0, 0.02 / sqrt(2 layers)); AttnRes projections zero (uniform mixing at start).
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.c.layers)
        writes = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "shared_experts.down_proj.weight",
                  "routed_expert_up_proj.weight", ".w2")
        for name, p in self.named_parameters():
            if name == "embed_tokens.weight":
                nn.init.normal_(p, std=1.0)
            elif (p.dim() == 2 or name.endswith((".w1", ".w3", ".w2"))) and "res_proj" not in name:
                nn.init.normal_(p, std=out_std if name.endswith(writes) else std)

    def forward(self, ids, kernel="chunk"):
        c = self.c
        h = self.embed_tokens(ids)
        bank = []
        for l, L in enumerate(self.layers):
            a_in = attn_res(bank + [h], L.self_attention_res_norm, L.self_attention_res_proj) if bank else h
            fresh = l % c.attn_res_block == 0
            if fresh:
                bank.append(h)
            y = L.self_attn(rms_norm(a_in, L.input_layernorm), kernel)
            h = y if fresh else h + y
            m_in = attn_res(bank + [h], L.mlp_res_norm, L.mlp_res_proj)
            h = h + L.mlp(rms_norm(m_in, L.post_attention_layernorm))
        out = attn_res(bank + [h], self.output_attn_res_norm, self.output_attn_res_proj)
        return self.lm_head(rms_norm(out, self.norm))
