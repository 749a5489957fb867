#!/usr/bin/env python3
"""Golden logits for the `kimi-linear-tiny` random checkpoint from the INDEPENDENT reference
`transformers.KimiLinearForCausalLM` (float32, CPU, eager attention, transformers' pure-PyTorch KDA path).

Run with the project venv (transformers + torch CPU):

    python tools/gen_kimi_linear_goldens.py \
        --kestrel build/release/kestrel --out tests/data/models/kimi_linear_tiny.safetensors

Steps
  1. `kestrel make-model --preset kimi-linear-tiny --out TMP` writes the original Moonshot checkpoint layout
     (config.json with one-based kda_layers/full_attn_layers, sharded safetensors with Moonshot names).
  2. The config is read by `KimiLinearConfig.from_pretrained(TMP)` (the library's own parsing of
     linear_attn_config, num_experts, ...); the model is constructed in float32 with eager attention and the
     checkpoint tensors are renamed HERE, explicitly, to transformers' native names (see `rename_checkpoint`)
     and loaded with `load_state_dict(strict=True)`; every checkpoint tensor must be consumed and every
     parameter/buffer must come from the checkpoint (asserted). As a cross-check, the same directory is also
     loaded with `from_pretrained` (the library's own kimi_linear conversion mapping) and must give bit-identical
     tensors.
  3. fla (flash-linear-attention, Triton, GPU only) is installed in the venv; transformers would dispatch KDA to
     fla's Triton kernels if it can import `fla`. We hide `fla` from the import system BEFORE importing
     transformers so transformers uses its own torch reference implementations (`chunk_kimi_delta_attention`
     for prefill, `recurrent_kimi_delta_attention` for 1-token decode with a cache, torch `causal_conv1d_fn` /
     `causal_conv1d_update`). This changes no math of the reference: these are transformers' documented
     fallbacks. The script asserts which implementations run and counts their calls.

Outputs (safetensors):
  prompt            I32 [200]        numpy RandomState(0).randint(0, vocab, 200)
  logits            F32 [200, vocab] one forward over the whole prompt (no cache)
  greedy_prompt_len I32 [1]          65
  greedy            I32 [32]         greedy continuation of prompt[:65] (cache; eos does not stop it)
  metadata: reference, preset, command, and the self-consistency numbers.
"""
import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile

# Hide fla (Triton kernels, GPU only) so transformers binds its pure-PyTorch KDA / conv fallbacks.
sys.modules["fla"] = None

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_command import recorded_command  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from transformers import DynamicCache, KimiLinearConfig, KimiLinearForCausalLM  # noqa: E402
from transformers.models.kimi_linear import modeling_kimi_linear as mkl  # noqa: E402

PRESET = "kimi-linear-tiny"
PROMPT_LEN = 200
GREEDY_PROMPT_LEN = 65
GREEDY_NEW = 32


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


def rename_checkpoint(ckpt, config):
    """Moonshot checkpoint names -> transformers KimiLinear native names (float32). Returns (state_dict, used)."""
    out, used = {}, set()

    def take(name):
        assert name in ckpt, f"missing checkpoint tensor {name}"
        assert name not in used, f"checkpoint tensor used twice: {name}"
        used.add(name)
        return ckpt[name].to(torch.float32)

    out["model.embed_tokens.weight"] = take("model.embed_tokens.weight")
    out["model.norm.weight"] = take("model.norm.weight")
    out["lm_head.weight"] = take("lm_head.weight")
    E = config.num_local_experts
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = take(p + n)
        a = p + "self_attn."
        if config.layer_types[i] == "linear_attention":
            for n in ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj", "o_norm"):
                out[a + n + ".weight"] = take(a + n + ".weight")
            # depthwise convs [P,1,W] stacked q|k|v along channels -> conv1d.weight [3P,1,W]
            out[a + "conv1d.weight"] = torch.cat([take(a + f"{c}_conv1d.weight") for c in "qkv"], dim=0)
            # forget gate lives in a submodule; A_log [1,1,H,1] and dt_bias [P] keep their checkpoint shapes
            for n in ("f_a_proj.weight", "f_b_proj.weight", "A_log", "dt_bias"):
                out[a + "forget_gate." + n] = take(a + n)
        else:
            assert config.layer_types[i] == "full_attention"
            for n in ("q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
                out[a + n + ".weight"] = take(a + n + ".weight")
        if config.mlp_layer_types[i] == "dense":
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = take(p + f"mlp.{n}.weight")
        else:
            m = p + "block_sparse_moe."
            out[p + "mlp.gate.weight"] = take(m + "gate.weight")
            out[p + "mlp.gate.e_score_correction_bias"] = take(m + "gate.e_score_correction_bias")
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.shared_experts.{n}.weight"] = take(m + f"shared_experts.{n}.weight")
            # experts: gate_up_proj[e] = [w1 (gate); w3 (up)] rows, down_proj[e] = w2
            out[p + "mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([take(m + f"experts.{e}.w1.weight"), take(m + f"experts.{e}.w3.weight")], dim=0)
                 for e in range(E)])
            out[p + "mlp.experts.down_proj"] = torch.stack([take(m + f"experts.{e}.w2.weight") for e in range(E)])
    unused = set(ckpt) - used
    assert not unused, f"checkpoint tensors not used: {sorted(unused)}"
    return out, used


class CallCounter:
    """Counts calls to transformers' module-level KDA / conv functions (delegates unchanged)."""

    def __init__(self, names):
        self.counts = {n: 0 for n in names}
        for n in names:
            fn = getattr(mkl, n)
            cv = inspect.getclosurevars(fn).nonlocals
            # use_kernel_func_from_hub_with_fallback: must have bound the torch function, not fla's kernel
            assert cv.get("is_new_implementation") is False and cv["implementation"] is cv["torch_function"], \
                f"{n} is not bound to transformers' torch implementation"
            setattr(mkl, n, self._wrap(n, fn))

    def _wrap(self, n, fn):
        def wrapped(*args, **kwargs):
            self.counts[n] += 1
            return fn(*args, **kwargs)
        return wrapped

    def take(self):
        c = dict(self.counts)
        for n in self.counts:
            self.counts[n] = 0
        return c


def check_semantics(model, config):
    """Print and assert the reference semantics that matter for our engine's kimi_linear config."""
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"attn_implementation={model.config._attn_implementation}")
    print(f"layer_types={config.layer_types}")
    print(f"mlp_layer_types={config.mlp_layer_types}")
    assert model.config._attn_implementation == "eager"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(b.dtype == torch.float32 for b in model.buffers())
    lm = model.model
    print(f"rms_norm_eps(config)={config.rms_norm_eps}  final norm eps={lm.norm.variance_epsilon}")
    for i, layer in enumerate(lm.layers):
        at = layer.self_attn
        s = (f"layer {i}: input_ln eps={layer.input_layernorm.variance_epsilon} "
             f"post_ln eps={layer.post_attention_layernorm.variance_epsilon}")
        if isinstance(at, mkl.KimiLinearDeltaAttention):
            s += (f" | KDA o_norm eps={at.o_norm.variance_epsilon} o_norm act={at.o_norm.activation}"
                  f" conv act={at.activation} conv W={at.conv_kernel_size}")
            assert at.o_norm.activation == "sigmoid" and at.activation == "silu"
            assert at.o_norm.variance_epsilon == config.rms_norm_eps
        else:
            s += (f" | MLA kv_a_layernorm eps={at.kv_a_layernorm.variance_epsilon} scaling={at.scaling:.8f}"
                  f" (192^-0.5={192 ** -0.5:.8f}) q_lora={at.q_lora_rank}")
            assert at.kv_a_layernorm.variance_epsilon == 1e-6
        if isinstance(layer.mlp, mkl.KimiLinearMoE):
            g = layer.mlp.gate
            s += (f" | router top_k={g.top_k} E={g.num_experts} groups={g.num_group}/{g.topk_group} "
                  f"renorm={g.norm_topk_prob} scale={g.routed_scaling_factor}")
        print(s)
    l2_eps = inspect.signature(mkl.l2norm).parameters["eps"].default
    print(f"l2norm: x / sqrt(sum x^2 + eps), default eps={l2_eps}; KDA calls pass eps=1e-6 (source)")

    gen = torch.Generator().manual_seed(123)
    x = torch.randn(1, 7, config.hidden_size, generator=gen)
    with torch.no_grad():
        # KDA forget gate: g = -exp(A_log) * softplus(f + dt_bias) (softplus threshold 20)
        kda = next(l.self_attn for l in lm.layers if isinstance(l.self_attn, mkl.KimiLinearDeltaAttention))
        fg = kda.forget_gate
        g_ref = fg(x)
        f = fg.f_b_proj(fg.f_a_proj(x)) + fg.dt_bias.view(1, 1, -1)
        g_mine = -torch.exp(fg.A_log.view(1, 1, -1, 1)) * F.softplus(f.view(1, 7, -1, fg.head_dim))
        d = (g_ref - g_mine).abs().max().item()
        print(f"KDA gate == -exp(A_log)*softplus(f+dt_bias): max|diff|={d:.3e}")
        assert d < 1e-5
        # Router: selection by sigmoid + e_score_correction_bias; weights = UNBIASED sigmoid, renormalised,
        # times routed_scaling_factor
        moe = next(l.mlp for l in lm.layers if isinstance(l.mlp, mkl.KimiLinearMoE))
        r = moe.gate
        _, w_ref, idx_ref = r(x)
        s = torch.sigmoid(x.view(-1, config.hidden_size) @ r.weight.T)
        idx = torch.topk(s + r.e_score_correction_bias, r.top_k, dim=-1).indices
        assert torch.equal(torch.sort(idx, -1).values, torch.sort(idx_ref, -1).values), "router selection"
        w = s.gather(1, idx_ref)
        w = w / w.sum(-1, keepdim=True) * r.routed_scaling_factor
        d = (w - w_ref).abs().max().item()
        wb = s.gather(1, idx_ref) + r.e_score_correction_bias[idx_ref]
        wb = wb / wb.sum(-1, keepdim=True) * r.routed_scaling_factor
        db = (wb - w_ref).abs().max().item()
        print(f"router weights == unbiased sigmoid renorm x {r.routed_scaling_factor}: max|diff|={d:.3e} "
              f"(vs bias-included weights: {db:.3e})")
        assert d < 1e-6 and db > 1e-5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kestrel", required=True, help="path to the kestrel binary (for make-model)")
    ap.add_argument("--out", default="tests/data/models/kimi_linear_tiny.safetensors")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    command = recorded_command("gen_kimi_linear_goldens.py")

    with tempfile.TemporaryDirectory(prefix="kimi_linear_tiny_") as tmp:
        ckpt_dir = os.path.join(tmp, "ckpt")
        subprocess.run([args.kestrel, "make-model", "--preset", PRESET, "--out", ckpt_dir], check=True)
        config = KimiLinearConfig.from_pretrained(ckpt_dir)
        config._attn_implementation = "eager"
        ckpt = load_checkpoint(ckpt_dir)
        print(f"checkpoint: {len(ckpt)} tensors, dtypes "
              f"{sorted({str(t.dtype) for t in ckpt.values()})}")

        model = KimiLinearForCausalLM(config).to(torch.float32).eval()
        sd, used = rename_checkpoint(ckpt, config)
        expected = set(model.state_dict().keys())
        assert set(sd) == expected, (sorted(set(sd) - expected), sorted(expected - set(sd)))
        # every parameter and every buffer (persistent or not) must be in the state dict we load
        names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        assert names == expected, f"params/buffers not covered by state_dict: {sorted(names ^ expected)}"
        res = model.load_state_dict(sd, strict=True)
        assert not res.missing_keys and not res.unexpected_keys
        msd = model.state_dict()
        for k, v in sd.items():
            assert msd[k].shape == v.shape and torch.equal(msd[k], v), k
        print(f"loaded {len(sd)} model tensors from {len(used)} checkpoint tensors (strict, all used)")

        # Cross-check: the library's own conversion mapping for the original names gives the same tensors.
        ref, info = KimiLinearForCausalLM.from_pretrained(
            ckpt_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        rsd = ref.state_dict()
        assert set(rsd) == set(sd)
        for k, v in sd.items():
            assert torch.equal(rsd[k].float(), v), f"from_pretrained differs on {k}"
        print("from_pretrained (transformers' kimi_linear conversion mapping) loads identical tensors")
        del ref, rsd

    check_semantics(model, config)
    counter = CallCounter(["chunk_kimi_delta_attention", "recurrent_kimi_delta_attention",
                           "causal_conv1d_fn", "causal_conv1d_update"])

    vocab = config.vocab_size
    prompt = np.random.RandomState(0).randint(0, vocab, size=PROMPT_LEN).astype(np.int64)
    meta = {}
    with torch.no_grad():
        ids = torch.from_numpy(prompt)[None]
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        c = counter.take()
        print(f"full forward T={PROMPT_LEN}: calls {c}")
        assert c["chunk_kimi_delta_attention"] > 0 and c["recurrent_kimi_delta_attention"] == 0
        pre = model(input_ids=ids[:, :GREEDY_PROMPT_LEN], use_cache=False).logits[0].float()
        counter.take()
        d_prefix = (pre - logits[:GREEDY_PROMPT_LEN]).abs().max().item()
        print(f"self-consistency: prefix[{GREEDY_PROMPT_LEN}] alone vs rows 0..{GREEDY_PROMPT_LEN - 1} of the "
              f"{PROMPT_LEN} run: max|diff|={d_prefix:.3e} (max|logit|={logits.abs().max().item():.3f})")
        assert d_prefix < 1e-3

        # Greedy with the cache: prefill 65 (chunk path), then 1-token steps (recurrent path + conv update).
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
        c = counter.take()
        print(f"greedy (cache) calls {c}")
        assert c["recurrent_kimi_delta_attention"] > 0 and c["causal_conv1d_update"] > 0
        step_logits = torch.stack(step_logits)
        # teacher-forced no-cache forward over prompt[:65] + greedy[:-1] must reproduce the cached steps
        tf_ids = torch.cat([ids[:, :GREEDY_PROMPT_LEN], torch.tensor([greedy[:-1]])], dim=1)
        tf = model(input_ids=tf_ids, use_cache=False).logits[0, GREEDY_PROMPT_LEN - 1:].float()
        counter.take()
        d_cache = (tf - step_logits).abs().max().item()
        assert torch.equal(tf.argmax(-1), torch.tensor(greedy)), "cached greedy != teacher-forced argmax"
        top2 = torch.topk(step_logits, 2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        print(f"self-consistency: cached decode vs teacher-forced full forward: max|diff|={d_cache:.3e}; "
              f"min greedy top1-top2 margin={margin:.4f}")
        assert d_cache < 1e-3
        # generate() must agree (eos disabled so it cannot stop early)
        gen = model.generate(ids[:, :GREEDY_PROMPT_LEN], attention_mask=torch.ones(1, GREEDY_PROMPT_LEN,
                             dtype=torch.long), do_sample=False, max_new_tokens=GREEDY_NEW, eos_token_id=None,
                             pad_token_id=config.pad_token_id)
        counter.take()
        gen = gen[0, GREEDY_PROMPT_LEN:].tolist()
        assert gen == greedy, f"generate() {gen} != manual greedy {greedy}"
        print(f"greedy continuation (== generate()): {greedy}")
        top2 = torch.topk(logits, 2, dim=-1).values
        print(f"full-logits min top1-top2 margin={(top2[:, 0] - top2[:, 1]).min().item():.4f}")

    meta["reference"] = f"transformers {transformers.__version__} KimiLinearForCausalLM float32"
    meta["preset"] = PRESET
    meta["command"] = command
    meta["kda_path"] = ("transformers torch fallbacks (fla hidden): chunk_kimi_delta_attention (chunk 64) for "
                        "prefill/no-cache, recurrent_kimi_delta_attention for 1-token cached decode; torch "
                        "causal_conv1d_fn / causal_conv1d_update")
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
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out} ({size} bytes)")
    assert size < 600 * 1024


if __name__ == "__main__":
    main()
