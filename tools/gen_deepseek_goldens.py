#!/usr/bin/env python3
"""Golden logits for the `deepseek-v3-tiny` / `deepseek-v32-tiny` random FP8 checkpoints from the INDEPENDENT
reference transformers `DeepseekV3ForCausalLM` / `DeepseekV32ForCausalLM` (float32, CPU, eager attention).

Run with the project venv (transformers + torch CPU):

    python tools/gen_deepseek_goldens.py --kestrel build/release/kestrel \
        --preset deepseek-v3-tiny --out tests/data/models/deepseek_v3_tiny.safetensors
    python tools/gen_deepseek_goldens.py --kestrel build/release/kestrel \
        --preset deepseek-v32-tiny --out tests/data/models/deepseek_v32_tiny.safetensors
    python tools/gen_deepseek_goldens.py --kestrel build/release/kestrel \
        --preset deepseek-v2style-tiny --out tests/data/models/deepseek_v2style_tiny.safetensors
    python tools/gen_deepseek_goldens.py --kestrel build/release/kestrel \
        --preset deepseek-v32-sparse-tiny --out tests/data/models/deepseek_v32_sparse_tiny.safetensors

`deepseek-v2style-tiny` is a deepseek_v3-typed checkpoint with V2-Lite-like choices (no q_lora, softmax
`group_limited_greedy` routing without a correction bias, norm_topk_prob false, bf16). Its reference is
transformers `DeepseekV2ForCausalLM` (config = the same JSON with model_type deepseek_v2), whose router
implements the softmax / group-max path and whose RoPE is a separate implementation of the interleaved
rotation (complex multiply of adjacent pairs, `view_as_complex`) — a second, independent check of ours.

Steps
  1. `kestrel make-model --preset P --out TMP` writes the DeepSeek release layout: config.json (rope_scaling yarn,
     noaux_tc routing with groups, quantization_config fp8 e4m3 [128, 128]), sharded safetensors with FP8
     (float8_e4m3fn) linears + float32 `weight_scale_inv` [ceil(N/128), ceil(K/128)], bf16 embeddings / lm_head /
     norms / router, fp32 e_score_correction_bias, and (v3) one MTP layer's tensors.
  2. The config is parsed by the library (`DeepseekV3Config.from_pretrained`: rope_scaling → rope_parameters,
     rope_interleave defaults to True). FP8 weights are DEQUANTISED HERE with DeepSeek's documented rule
     (README_WEIGHTS / kernel.py weight_dequant): W[i, j] = float(e4m3[i, j]) · scale_inv[i // 128, j // 128],
     using torch's own float8_e4m3fn → float32 conversion. As a cross-check the same directory is also loaded by
     `from_pretrained` with transformers' FineGrainedFP8 integration in dequantize mode (needs accelerate), and
     every FP8 weight through transformers' `_dequantize_fp8_weight`; see library_fp8_crosscheck for what must
     agree (a failure stops the script; metadata `library_fp8_crosscheck` records the result). That loader
     derives its block size from the scale grid, which differs from DeepSeek's rule on tensors with a partial
     128-block (the tiny presets have them); the check accounts for each such tensor exactly.
     Tensors are renamed explicitly (experts → stacked gate_up_proj / down_proj) and loaded strictly; every
     checkpoint tensor is consumed except the MTP layer (transformers does not build it; listed and asserted).
  3. V3.2: transformers' DSA indexer runs (top-k over min(index_topk, T) keys), with its SCORING replaced by
     DeepSeek's reference semantics (monkeypatch of DeepseekV32Indexer.forward below, see "Indexer"). With
     index_topk ≥ every prompt length (deepseek-v32-tiny) it selects every causal key, so the result must equal
     dense MLA; the script checks this by running DeepseekV3ForCausalLM on the same weights without the
     indexer (assert max|diff| < 1e-5). deepseek-v32-sparse-tiny (same tensors, index_topk 8) makes the
     selection sparse on 192 of the 200 prompt rows and on every decode step; its golden also stores the
     reference's top-k sets of every layer for the full-prompt forward.

Indexer (V3.2): transformers 5.x `DeepseekV32Indexer` computes the scores in bf16/fp32 WITHOUT the Hadamard
rotation and WITHOUT the FP8 act_quant of q and k (its docstring: "FP8 quantization is a precision
optimization, we skip both"). DeepSeek's reference (DeepSeek-V3.2-Exp inference/model.py Indexer + kernel.py
act_quant / fp8_index) quantizes q and k to e4m3 with ue8m0 (power-of-two) per-128 scales, and so does the
engine (kernels/cpu/dsa_indexer.h). Quantization moves scores by ~1e-2 relative, enough to swap near-tied
top-k choices, so the script patches transformers' indexer to the REFERENCE semantics: everything up to the
rotated q / k (wq_b on q_resid, LayerNorm(wk x), the model's cos/sin applied NeoX-style by transformers' own
apply_rotary_pos_emb, the indexer key cache) is transformers' code path re-run verbatim; then
rotate_activation (Hadamard), act_quant(ue8m0) and the fp8_index score come from tools/gen_dsa_goldens.py (a
torch transcription of the reference, independent of the engine; e4m3 rounding is torch's float8_e4m3fn cast).
For information the unpatched transformers indexer is also run on the sparse preset: the metadata records how
many top-k sets and how much the logits differ from the reference semantics.

Outputs (safetensors):
  prompt            I32 [200]        numpy RandomState(0).randint(0, vocab, 200)
  logits            F32 [200, vocab] one forward over the whole prompt (no cache)
  greedy_prompt_len I32 [1]          65
  greedy            I32 [32]         greedy continuation of prompt[:65] (with cache; eos does not stop it)
  topk              I32 [layers, 200, index_topk]   (deepseek-v32-sparse-tiny only) each layer's selection for the
                                     full-prompt forward: row t lists the chosen positions ≤ t ascending, −1 padded
  metadata: reference, preset, command, self-consistency numbers.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.numpy import save_file
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                          DeepseekV32Config, DeepseekV32ForCausalLM, DynamicCache)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_command import recorded_command  # noqa: E402
from gen_dsa_goldens import UPSTREAM as DSA_UPSTREAM, act_quant, rotate_activation, sylvester  # noqa: E402  (reference transcription)
from transcription import transcription_sha256  # noqa: E402
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as tf_v32  # noqa: E402

PROMPT_LEN = 200
GREEDY_PROMPT_LEN = 65
GREEDY_NEW = 32
BLOCK = 128


def load_checkpoint(ckpt_dir):
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(os.path.join(ckpt_dir, shard), "pt") as s:
            for k in s.keys():
                assert weight_map[k] == shard, k
                tensors[k] = s.get_tensor(k)
    assert set(tensors) == set(weight_map), "index and shards disagree"
    return tensors


def dequant_fp8(w, scale_inv):
    """DeepSeek block FP8: each 128x128 block of W times its scale_inv (edge blocks partial)."""
    assert w.dtype == torch.float8_e4m3fn and scale_inv.dtype == torch.float32
    n, k = w.shape
    assert scale_inv.shape == ((n + BLOCK - 1) // BLOCK, (k + BLOCK - 1) // BLOCK), (w.shape, scale_inv.shape)
    s = scale_inv.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return w.to(torch.float32) * s


def dequant_fp8_grid_block(w, scale_inv):
    """transformers' FineGrainedFP8 *loader* rule (integrations/finegrained_fp8.py Fp8Dequantize), re-typed: the
    block size is derived from the scale grid, (rows // scale_rows, cols // scale_cols). It equals DeepSeek's
    128 x 128 only when the dims are multiples of 128; with a partial edge block (e.g. 160 rows, 2 scale rows)
    the loader uses 80-row blocks. Used only to explain the loader's tensors in the cross-check."""
    n, k = w.shape
    sr, sc = scale_inv.shape
    assert n % sr == 0 and k % sc == 0, "the loader itself refuses this shape"
    q = w.to(torch.float32).reshape(sr, n // sr, sc, k // sc)
    return (q * scale_inv.reshape(sr, 1, sc, 1)).reshape(n, k)


def rename_checkpoint(ckpt, config, dequant=dequant_fp8):
    """DeepSeek HF checkpoint names -> transformers native names, fp32. Returns (state_dict, used)."""
    out, used = {}, set()
    n_fp8 = 0

    def take(name):
        nonlocal n_fp8
        assert name in ckpt, f"missing checkpoint tensor {name}"
        assert name not in used, f"checkpoint tensor used twice: {name}"
        used.add(name)
        t = ckpt[name]
        if t.dtype == torch.float8_e4m3fn:
            assert name.endswith(".weight")
            si = name + "_scale_inv"
            used.add(si)
            n_fp8 += 1
            return dequant(t, ckpt[si])
        assert not name.endswith(".weight") or name + "_scale_inv" not in ckpt
        return t.to(torch.float32)

    for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        out[n] = take(n)
    E = config.n_routed_experts
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = take(p + n)
        a = p + "self_attn."
        q_names = ("q_a_proj", "q_a_layernorm", "q_b_proj") if config.q_lora_rank else ("q_proj",)
        for n in q_names + ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
            out[a + n + ".weight"] = take(a + n + ".weight")
        if config.model_type == "deepseek_v32":
            for n in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"):
                out[a + "indexer." + n] = take(a + "indexer." + n)
        if i < config.first_k_dense_replace:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = take(p + f"mlp.{n}.weight")
        else:
            m = p + "mlp."
            out[m + "gate.weight"] = take(m + "gate.weight")
            if config.model_type != "deepseek_v2":  # V2-style softmax routing has no correction bias
                out[m + "gate.e_score_correction_bias"] = take(m + "gate.e_score_correction_bias")
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[m + f"shared_experts.{n}.weight"] = take(m + f"shared_experts.{n}.weight")
            out[m + "experts.gate_up_proj"] = torch.stack(
                [torch.cat([take(m + f"experts.{e}.gate_proj.weight"), take(m + f"experts.{e}.up_proj.weight")], 0)
                 for e in range(E)])
            out[m + "experts.down_proj"] = torch.stack([take(m + f"experts.{e}.down_proj.weight") for e in range(E)])
    unused = set(ckpt) - used
    mtp = {f"model.layers.{config.num_hidden_layers + k}." for k in range(config.num_nextn_predict_layers)}
    assert all(any(u.startswith(p) for p in mtp) for u in unused), f"unused non-MTP tensors: {sorted(unused)}"
    print(f"dequantised {n_fp8} FP8 block weights; {len(unused)} MTP-layer tensors not used: {sorted(unused)}")
    return out, used


def build(cls, config, sd):
    model = cls(config).to(torch.float32).eval()
    expected = set(model.state_dict().keys())
    assert set(sd) == expected, (sorted(set(sd) - expected), sorted(expected - set(sd)))
    res = model.load_state_dict(sd, strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    return model


def library_fp8_crosscheck(cls, ckpt_dir, ckpt, config, sd):
    """Cross-checks of the dequantisation rule against transformers' own FP8 code; any failure stops the script and
    the golden's metadata records what ran and what it found.
      (a) transformers' block dequantiser `_dequantize_fp8_weight` (block [128, 128], partial edge blocks cut as
          DeepSeek's kernel.py weight_dequant does) on every FP8 weight of the checkpoint: must equal ours exactly.
      (b) the whole directory through from_pretrained with FineGrainedFP8Config(dequantize=True) (needs
          accelerate): every tensor must equal ours, except tensors with a partial 128-block, where that loader
          derives its block size from the scale grid (dequant_fp8_grid_block); those must equal that rule
          exactly, so the loader's deviation from DeepSeek's rule is fully accounted for, and are counted."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    n_a, worst_a = 0, 0.0
    for name, t in ckpt.items():
        if t.dtype == torch.float8_e4m3fn:
            theirs = _dequantize_fp8_weight(t, ckpt[name + "_scale_inv"], [BLOCK, BLOCK], torch.float32)
            worst_a = max(worst_a, (theirs - dequant_fp8(t, ckpt[name + "_scale_inv"])).abs().max().item())
            n_a += 1
    assert n_a > 0 and worst_a == 0.0, f"_dequantize_fp8_weight differs from the script's rule: {worst_a:.3e}"
    ref = cls.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager",
                              quantization_config=FineGrainedFP8Config(dequantize=True))
    rsd = ref.state_dict()
    missing = sorted(k for k in sd if k not in rsd)
    assert not missing, f"library FP8 load lacks {len(missing)} tensors: {missing[:8]}"
    grid, _ = rename_checkpoint(ckpt, config, dequant=dequant_fp8_grid_block)
    same, partial, worst_partial, worst_grid = 0, [], 0.0, 0.0
    for k, v in sd.items():
        assert rsd[k].shape == v.shape, (k, tuple(rsd[k].shape), tuple(v.shape))
        d = (rsd[k].float() - v).abs().max().item()
        if d == 0.0:
            same += 1
            continue
        partial.append(k)
        worst_partial = max(worst_partial, d)
        worst_grid = max(worst_grid, (rsd[k].float() - grid[k]).abs().max().item())
    assert worst_grid == 0.0, f"from_pretrained differs from both rules on {partial}: {worst_grid:.3e}"
    msg = (f"ran: transformers {transformers.__version__} _dequantize_fp8_weight([128, 128]) == this script's rule on "
           f"all {n_a} FP8 weights (max|diff| 0); from_pretrained(FineGrainedFP8Config(dequantize=True)) == the "
           f"script's tensors on {same} of {len(sd)}; the other {len(partial)} have a partial 128-block, where that "
           f"loader takes its block size from the scale grid (rows // scale_rows): equal to that rule exactly "
           f"(max|diff| 0), {worst_partial:.3e} from DeepSeek's")
    print(f"library FP8 dequantisation cross-check: {msg}")
    return msg


_tf_indexer_forward = tf_v32.DeepseekV32Indexer.forward
TOPK_LOG = None  # when a list: every indexer call appends (layer_idx, indices [S, k], kth-gap [S])


@torch.no_grad()
def reference_indexer_forward(self, hidden_states, q_resid, position_embeddings, attention_mask,
                              position_ids=None, cache=None, **kwargs):
    """transformers' DeepseekV32Indexer.forward up to the rotated q/k (same calls), then DeepSeek's reference
    scoring: Hadamard, act_quant e4m3 with ue8m0 scales, fp8_index (ReLU(q8·k8) · w · q_scale summed over heads,
    · k_scale), masked top-k."""
    if "past_key_values" in kwargs:
        cache = kwargs.pop("past_key_values")
    B, S, _ = hidden_states.shape
    cos, sin = position_embeddings
    q = self.wq_b(q_resid).view(B, S, self.n_heads, self.head_dim)
    q_rot, q_pass = torch.split(q, [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim], dim=-1)
    k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = tf_v32.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    if cache is not None:
        k = cache.update_indexer(k, self.layer_idx)
    q8, q_scale = act_quant(rotate_activation(q.float()), "ue8m0")   # [B,S,H,D], [B,S,H,1]
    k8, k_scale = act_quant(rotate_activation(k.float()), "ue8m0")   # [B,T,D], [B,T,1]
    w = self.weights_proj(hidden_states.float()).float() * self.n_heads ** -0.5
    w = w.unsqueeze(-1) * q_scale * self.head_dim ** -0.5            # [B,S,H,1]
    logits = torch.einsum("bshd,btd->bsht", q8.float(), k8.float())
    score = (logits.clamp_min(0) * w).sum(2) * k_scale[..., 0].unsqueeze(1)  # [B,S,T]
    if attention_mask.dtype == torch.bool:
        score = score.masked_fill(~attention_mask, float("-inf"))
    else:
        score = score + attention_mask
    topk = min(self.index_topk, score.shape[-1])
    top = score.topk(topk, dim=-1)
    if TOPK_LOG is not None:
        gap = torch.full((S,), float("inf"))
        if score.shape[-1] > topk:  # relative gap between the k-th and the (k+1)-th score of each row
            vals = score[0].topk(topk + 1, dim=-1).values
            # Only rows that see more than topk keys really choose (masked scores are -inf or finfo.min).
            chooses = (score[0] > -1e30).sum(-1) > topk
            gap[chooses] = ((vals[chooses, topk - 1] - vals[chooses, topk]) /
                            vals[chooses, :topk].abs().max(-1).values.clamp_min(1e-30))
        TOPK_LOG.append((self.layer_idx, top.indices[0].to(torch.int32), gap))
    return top.indices.to(torch.int32)


def selection_table(log, n_layers, S, k):
    """[layers, S, k]: row t = the chosen positions ≤ t ascending, −1 padded (masked picks of short rows dropped)."""
    out = np.full((n_layers, S, k), -1, dtype=np.int32)
    for layer, idx, _ in log:
        for t in range(S):
            sel = sorted(int(p) for p in idx[t].tolist() if p <= t)
            out[layer, t, :len(sel)] = sel
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kestrel", required=True, help="path to the kestrel binary (for make-model)")
    ap.add_argument("--preset", default="deepseek-v3-tiny", choices=["deepseek-v3-tiny", "deepseek-v32-tiny",
                                                                 "deepseek-v32-sparse-tiny", "deepseek-v2style-tiny"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    command = recorded_command("gen_deepseek_goldens.py")
    v32 = args.preset in ("deepseek-v32-tiny", "deepseek-v32-sparse-tiny")
    sparse = args.preset == "deepseek-v32-sparse-tiny"
    global TOPK_LOG
    if v32:  # reference indexer semantics (see the module docstring)
        tf_v32.DeepseekV32Indexer.forward = reference_indexer_forward
    v2 = args.preset == "deepseek-v2style-tiny"
    cfg_cls, cls = ((DeepseekV32Config, DeepseekV32ForCausalLM) if v32 else
                    (DeepseekV2Config, DeepseekV2ForCausalLM) if v2 else (DeepseekV3Config, DeepseekV3ForCausalLM))
    meta = {}

    with tempfile.TemporaryDirectory(prefix="deepseek_tiny_") as tmp:
        ckpt_dir = os.path.join(tmp, "ckpt")
        subprocess.run([args.kestrel, "make-model", "--preset", args.preset, "--out", ckpt_dir], check=True)
        if v2:  # same JSON, read as a DeepSeek-V2 config (the file says deepseek_v3)
            with open(os.path.join(ckpt_dir, "config.json")) as f:
                raw = json.load(f)
            assert raw["scoring_func"] == "softmax" and raw["topk_method"] == "group_limited_greedy"
            raw["model_type"] = "deepseek_v2"
            config = DeepseekV2Config(**raw)
        else:
            config = cfg_cls.from_pretrained(ckpt_dir)
        qc = getattr(config, "quantization_config", None)
        print(f"config quantization_config: {qc}")
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # weights are dequantised below; build a plain fp32 model
        config._attn_implementation = "eager"
        ckpt = load_checkpoint(ckpt_dir)
        print(f"checkpoint: {len(ckpt)} tensors, dtypes {sorted({str(t.dtype) for t in ckpt.values()})}")
        sd, _ = rename_checkpoint(ckpt, config)
        model = build(cls, config, sd)
        if not v2:  # v2-style is a bf16 checkpoint: no FP8 weights
            meta["library_fp8_crosscheck"] = library_fp8_crosscheck(cls, ckpt_dir, ckpt, config, sd)

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"rope_parameters={config.rope_parameters} rope_interleave={getattr(config, 'rope_interleave', 'n/a (no such key for this class; its MLA rope is interleaved)')}")
    at = model.model.layers[0].self_attn
    print(f"MLA scaling={at.scaling:.8f} (qk^-0.5={at.qk_head_dim ** -0.5:.8f}); kv_a_layernorm eps="
          f"{at.kv_a_layernorm.variance_epsilon}; q_lora={config.q_lora_rank}")
    print(f"rotary inv_freq[:6]={model.model.rotary_emb.inv_freq[:6].tolist()} "
          f"attention_scaling={model.model.rotary_emb.attention_scaling}")
    g = model.model.layers[config.first_k_dense_replace].mlp.gate
    print(f"router: groups {g.num_group}/{g.topk_group}, top_k {g.top_k}, renorm {getattr(g, 'norm_topk_prob', 'n/a')}, "
          f"scale {g.routed_scaling_factor}, method {getattr(g, 'topk_method', 'noaux_tc')}")
    assert getattr(config, "rope_interleave", True) and at.kv_a_layernorm.variance_epsilon == 1e-6

    vocab = config.vocab_size
    prompt = np.random.RandomState(0).randint(0, vocab, size=PROMPT_LEN).astype(np.int64)
    with torch.no_grad():
        ids = torch.from_numpy(prompt)[None]
        gate = model.model.layers[config.first_k_dense_replace].mlp.gate
        seen = []
        hook = gate.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].detach(), out[2].detach())))
        TOPK_LOG = [] if v32 else None
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        hook.remove()
        topk_log, TOPK_LOG = TOPK_LOG, None
        # Group-limited routing must actually exclude experts for the golden to test it: count tokens whose
        # top-k over ALL experts (biased scores) differs from the group-limited choice at the first MoE layer.
        x, idx = seen[0]
        lg = x.view(-1, config.hidden_size).float() @ gate.weight.float().T
        biased = lg.softmax(-1) if v2 else torch.sigmoid(lg) + gate.e_score_correction_bias
        free = torch.topk(biased, gate.top_k, dim=-1).indices
        changed = sum(set(a.tolist()) != set(b.tolist()) for a, b in zip(free, idx))
        print(f"group limit changes the expert set of {changed}/{PROMPT_LEN} tokens at layer {config.first_k_dense_replace}")
        assert changed > 0
        meta["tokens_changed_by_group_limit"] = str(changed)
        if sparse:
            assert config.index_topk < 16 and len(topk_log) == config.num_hidden_layers
            sel = selection_table(topk_log, config.num_hidden_layers, PROMPT_LEN, config.index_topk)
            min_gap = min(float(g.min()) for _, _, g in topk_log)
            print(f"reference top-{config.index_topk} selections recorded for {len(topk_log)} layers; smallest "
                  f"relative gap between the k-th and (k+1)-th score over all rows/layers: {min_gap:.3e}")
            meta["topk_min_relative_gap"] = f"{min_gap:.6e}"
            # For information: transformers' own (unquantized, no Hadamard) indexer on the same weights.
            tf_v32.DeepseekV32Indexer.forward = _tf_indexer_forward
            raw_log = []
            hooks = [m.register_forward_hook(lambda mod, inp, out: raw_log.append((mod.layer_idx, out[0], None)))
                     for m in model.modules() if isinstance(m, tf_v32.DeepseekV32Indexer)]
            raw_logits = model(input_ids=ids, use_cache=False).logits[0].float()
            for h in hooks:
                h.remove()
            tf_v32.DeepseekV32Indexer.forward = reference_indexer_forward
            raw_sel = selection_table(raw_log, config.num_hidden_layers, PROMPT_LEN, config.index_topk)
            n_diff = int(sum((raw_sel[l, t] != sel[l, t]).any() for l in range(config.num_hidden_layers)
                             for t in range(PROMPT_LEN)))
            d_raw = (raw_logits - logits).abs().max().item()
            print(f"unpatched transformers indexer (no FP8, no Hadamard) vs reference semantics: {n_diff}/"
                  f"{config.num_hidden_layers * PROMPT_LEN} top-k sets differ, max|dlogit|={d_raw:.3e}")
            meta["unpatched_transformers_topk_sets_differing"] = f"{n_diff}/{config.num_hidden_layers * PROMPT_LEN}"
            meta["unpatched_transformers_max_abs_logit_diff"] = f"{d_raw:.6e}"
        if v32 and not sparse:
            assert config.index_topk >= PROMPT_LEN
            dense = build(DeepseekV3ForCausalLM, DeepseekV3Config(**{
                k: v for k, v in config.to_dict().items() if not k.startswith("index_")}),
                {k: v for k, v in sd.items() if ".indexer." not in k})
            d_dense = (dense(input_ids=ids, use_cache=False).logits[0].float() - logits).abs().max().item()
            print(f"V3.2 with its indexer (index_topk {config.index_topk} >= {PROMPT_LEN}) vs dense MLA "
                  f"(DeepseekV3ForCausalLM, same weights): max|diff|={d_dense:.3e}")
            assert d_dense < 1e-5
            meta["v32_vs_dense_max_abs_diff"] = f"{d_dense:.6e}"
        pre = model(input_ids=ids[:, :GREEDY_PROMPT_LEN], use_cache=False).logits[0].float()
        d_prefix = (pre - logits[:GREEDY_PROMPT_LEN]).abs().max().item()
        print(f"self-consistency: prefix[{GREEDY_PROMPT_LEN}] alone vs the {PROMPT_LEN} run: max|diff|={d_prefix:.3e} "
              f"(max|logit|={logits.abs().max().item():.3f})")
        assert d_prefix < 1e-3

        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids[:, :GREEDY_PROMPT_LEN], cache=cache, use_cache=True)
        cache = out.cache
        step_logits = [out.logits[0, -1].float()]
        greedy = []
        for t in range(GREEDY_NEW):
            nxt = int(torch.argmax(step_logits[-1]))
            greedy.append(nxt)
            if t + 1 == GREEDY_NEW:
                break
            out = model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
            cache = out.cache
            step_logits.append(out.logits[0, -1].float())
        step_logits = torch.stack(step_logits)
        tf_ids = torch.cat([ids[:, :GREEDY_PROMPT_LEN], torch.tensor([greedy[:-1]])], dim=1)
        tf = model(input_ids=tf_ids, use_cache=False).logits[0, GREEDY_PROMPT_LEN - 1:].float()
        d_cache = (tf - step_logits).abs().max().item()
        assert torch.equal(tf.argmax(-1), torch.tensor(greedy)), "cached greedy != teacher-forced argmax"
        top2 = torch.topk(step_logits, 2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        print(f"self-consistency: cached decode vs teacher-forced: max|diff|={d_cache:.3e}; min greedy margin={margin:.4f}")
        assert d_cache < 1e-3
        print(f"greedy continuation: {greedy}")

    meta["reference"] = f"transformers {transformers.__version__} {cls.__name__} float32 eager, FP8 dequantised"
    if v32:
        meta["reference"] += (", indexer scoring patched to DeepSeek-V3.2 reference semantics (Hadamard, e4m3 "
                              "act_quant ue8m0, fp8_index; tools/gen_dsa_goldens.py)")
    # Re-typed (not imported) reference code this golden depends on, with a hash of its source text.
    meta["fp8_dequant_rule"] = ("transcribed: deepseek-ai/DeepSeek-V3 inference/kernel.py weight_dequant "
                                "(README_WEIGHTS.md block rule)")
    meta["fp8_dequant_sha256"] = transcription_sha256(dequant_fp8)
    if v32:
        meta["indexer_reference_kind"] = "transcribed: upstream code re-typed into tools/gen_dsa_goldens.py, not imported"
        meta["indexer_upstream"] = DSA_UPSTREAM
        meta["indexer_transcription_functions"] = "act_quant,sylvester,rotate_activation,reference_indexer_forward"
        meta["indexer_transcription_sha256"] = transcription_sha256(act_quant, sylvester, rotate_activation,
                                                                    reference_indexer_forward)
    meta["preset"] = args.preset
    meta["command"] = command
    meta["torch"] = torch.__version__
    meta["prefix_vs_full_max_abs_diff"] = f"{d_prefix:.6e}"
    meta["cached_vs_teacher_forced_max_abs_diff"] = f"{d_cache:.6e}"
    meta["greedy_min_top2_margin"] = f"{margin:.6f}"
    tensors = {
        "prompt": prompt.astype(np.int32),
        "logits": np.ascontiguousarray(logits.numpy().astype(np.float32)),
        "greedy_prompt_len": np.array([GREEDY_PROMPT_LEN], dtype=np.int32),
        "greedy": np.array(greedy, dtype=np.int32),
    }
    if sparse:
        tensors["topk"] = sel
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out} ({size} bytes)")
    assert size < 600 * 1024


if __name__ == "__main__":
    main()
