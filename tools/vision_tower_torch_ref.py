"""A second, minimal transcription of the Kimi K3 vision tower (MoonViT3d) + projector (PatchMergerMLPV2).

Plain PyTorch fp32, written from docs/vision.md §5.1-§5.2 and the released `vision_config` keys, without importing
sglang or any other port: every step is spelled out with elementwise ops and matrix products (no nn.Module, no
F.interpolate, no SDPA, no nn.RMSNorm), so that it shares no code with the sglang reference it cross-checks in
tools/gen_vision_tower_goldens.py. Images only (t = 1).

    embed, merged, projected = forward(weights, vision_config, pixel_values, grids)

weights: the checkpoint's `vision_tower.*` / `mm_projector.*` tensors (any float dtype; converted to fp32).
pixel_values: [patches, 3, patch, patch] fp32, the images' patches one after the other in raster order.
grids: list of (1, h, w). Returns the patch embedding + position grid [patches, hidden], the tower output after
the final norm and the 2x2 merger [tokens, 4 * hidden] and the projector output [tokens, text_hidden_size].
"""
import math

import torch

ENCODER_NORM_EPS = torch.finfo(torch.float32).eps  # docs/vision.md §5.2: the encoder norms use the fp32 epsilon
ROPE_THETA = 10000.0


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def bilinear_resize(grid, out_h, out_w):
    """[H, W, C] -> [out_h, out_w, C], bilinear with half-pixel centres, clamped at the edges, no antialias."""
    in_h, in_w = grid.shape[0], grid.shape[1]

    def taps(out_n, in_n):
        src = ((torch.arange(out_n, dtype=torch.float64) + 0.5) * (in_n / out_n) - 0.5).clamp(min=0.0)
        lo = src.floor().long().clamp(max=in_n - 1)
        hi = (lo + 1).clamp(max=in_n - 1)
        frac = (src - lo.double()).float()
        return lo, hi, frac

    r0, r1, fr = taps(out_h, in_h)
    c0, c1, fc = taps(out_w, in_w)
    rows = grid[r0] * (1 - fr)[:, None, None] + grid[r1] * fr[:, None, None]  # [out_h, W, C]
    return rows[:, c0] * (1 - fc)[None, :, None] + rows[:, c1] * fc[None, :, None]


def rope_2d(x, h, w):
    """x: [n, heads, head_dim] of one image in raster order. Complex pair 2i (elements 4i, 4i+1) turns by
    column * f_i, pair 2i+1 (elements 4i+2, 4i+3) by row * f_i, with f_i = 1 / 10000^(4i / head_dim)."""
    n, heads, d = x.shape
    f = 1.0 / ROPE_THETA ** (torch.arange(0, d, 4)[: d // 4].float() / d)  # [d/4]
    idx = torch.arange(n)
    row, col = (idx // w).float(), (idx % w).float()
    angle = torch.stack([col[:, None] * f[None, :], row[:, None] * f[None, :]], dim=-1).reshape(n, d // 2)
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    re, im = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = re * cos - im * sin
    out[..., 1::2] = re * sin + im * cos
    return out


def attention(q, k, v):
    """[n, heads, head_dim] each; bidirectional, scale 1/sqrt(head_dim), softmax in fp32."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).reshape(q.shape[0], -1)


def forward(weights, vision_config, pixel_values, grids):
    c = vision_config
    wt = {k: v.float() for k, v in weights.items()}
    hidden, heads, qkv = c["vt_hidden_size"], c["vt_num_attention_heads"], c["qkv_hidden_size"]
    head_dim = qkv // heads
    patch = c["patch_size"]
    for t, h, w in grids:
        if t != 1 or h % 2 or w % 2:
            raise ValueError(f"grid {(t, h, w)}: images only (t = 1), sides even")

    # Patch embedding: the kernel = stride = patch Conv2d is one matrix over each patch's channel-major pixels.
    proj = wt["vision_tower.patch_embed.proj.weight"].reshape(hidden, 3 * patch * patch)
    x = pixel_values.reshape(-1, 3 * patch * patch) @ proj.T
    pos = wt["vision_tower.patch_embed.pos_emb.weight"]  # [H0, W0, hidden]
    pieces = []
    for _, h, w in grids:
        g = pos if (h, w) == tuple(pos.shape[:2]) else bilinear_resize(pos, h, w)
        pieces.append(g.reshape(h * w, hidden))
    x = x + torch.cat(pieces)
    embed = x.clone()

    for i in range(c["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{i}."
        y = rms_norm(x, wt[p + "norm0.weight"], ENCODER_NORM_EPS) @ wt[p + "wqkv.weight"].T
        q, k, v = y[:, :qkv], y[:, qkv:2 * qkv], y[:, 2 * qkv:]
        outs, start = [], 0
        for _, h, w in grids:  # attention never crosses images
            s = slice(start, start + h * w)
            qi, ki, vi = (z[s].reshape(h * w, heads, head_dim) for z in (q, k, v))
            outs.append(attention(rope_2d(qi, h, w), rope_2d(ki, h, w), vi))
            start += h * w
        x = x + torch.cat(outs) @ wt[p + "wo.weight"].T
        y = rms_norm(x, wt[p + "norm1.weight"], ENCODER_NORM_EPS) @ wt[p + "mlp.fc0.weight"].T
        x = x + gelu_tanh(y) @ wt[p + "mlp.fc1.weight"].T
    x = rms_norm(x, wt["vision_tower.encoder.final_layernorm.weight"], ENCODER_NORM_EPS)

    # 2x2 merger: each window in raster order becomes one token, its patches in (row, column) order.
    merged, start = [], 0
    for _, h, w in grids:
        img = x[start:start + h * w].reshape(h // 2, 2, w // 2, 2, hidden)
        merged.append(img.permute(0, 2, 1, 3, 4).reshape((h // 2) * (w // 2), 4 * hidden))
        start += h * w
    merged = torch.cat(merged)

    y = gelu_erf(merged @ wt["mm_projector.proj.0.weight"].T) @ wt["mm_projector.proj.2.weight"].T
    projected = rms_norm(y, wt["mm_projector.post_norm.weight"], c["projector_ln_eps"])
    return embed, merged, projected
