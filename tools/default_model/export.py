"""Exports weights from train.py to a checkpoint in the released Kimi K3 layout (docs/model-math.md §1), the way
Kestrel's k3 presets write it (src/models/checkpoint_generator.cpp):

  config.json                     KimiK3ForConditionalGeneration, text_config (kimi_linear), vision_config,
                                  compressed-tensors mxfp4-pack-quantized quantization_config
  model-0000N-of-0000M.safetensors + model.safetensors.index.json
  tiktoken.model, tokenizer_config.json (from bpe.py)

Tensor dtypes as the release: routed experts MXFP4 (weight_packed U8 [out, in/2], adjacent elements low nibble
first; weight_scale U8 E8M0 [out, in/32]); conv1d weights, dt_bias, A_log, o_norm and the router correction bias
fp32; everything else bf16. The vision tower and projector (MoonViT3d + PatchMergerMLPV2 at the presets' small
widths) are not trained: Kestrel validates and skips them (text only); they hold fixed random values so the
directory is a complete K3 checkpoint.

    python export.py --weights RUN_DIR --vocab VOCAB_DIR --out models/default
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3torch  # noqa: E402
from train import load_weights  # noqa: E402

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
F32_SUFFIXES = ("conv1d.weight", "dt_bias", "A_log", "o_norm.weight", "e_score_correction_bias")
VISION = dict(vt_layers=2, vt_hidden=64, vt_intermediate=128, vt_heads=2, vt_qkv=64, vt_patch=14, vt_pos_grid=8)


def mxfp4_quantize(w):
    """W [out, in] -> (packed U8 [out, in/2], scale U8 [out, in/32]); per 32-block the E8M0 scale 2^e is the
    smaller of ceil(log2(amax / 6)) (no clipping) and that minus one (clips the largest values) with the lower
    squared error, codes are the nearest E2M1 values."""
    out, inn = w.shape
    assert inn % 32 == 0
    b = w.float().reshape(out, inn // 32, 32)
    amax = b.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -120)
    e_hi = torch.ceil(torch.log2(amax / 6.0))
    best_err, best_codes, best_e = None, None, None
    for e in (e_hi, e_hi - 1):
        x = b / torch.exp2(e)
        mag = (x.abs()[..., None] - E2M1).abs().argmin(-1)          # nearest magnitude index 0..7
        deq = E2M1[mag] * torch.sign(x) * torch.exp2(e)
        err = (deq - b).pow(2).sum(-1, keepdim=True)
        codes = mag | ((x < 0) & (mag > 0)).to(mag.dtype) << 3
        if best_err is None:
            best_err, best_codes, best_e = err, codes, e
        else:
            take = err < best_err
            best_codes = torch.where(take, codes, best_codes)
            best_e = torch.where(take, e, best_e)
            best_err = torch.minimum(err, best_err)
    codes = best_codes.reshape(out, inn).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale = (best_e.reshape(out, inn // 32) + 127).clamp(0, 254).to(torch.uint8)
    return packed.contiguous(), scale.contiguous()


def mxfp4_dequantize(packed, scale):
    lo, hi = packed & 0xF, packed >> 4
    codes = torch.stack([lo, hi], -1).reshape(packed.shape[0], -1).long()
    val = E2M1[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    s = torch.exp2(scale.float() - 127).repeat_interleave(32, dim=1)
    return val * s


def released_tensors(cfg, sd):
    """[(name, tensor)] in the release's order and dtypes; experts as (packed, scale) pairs."""
    R = "language_model.model."
    out = [(R + "embed_tokens.weight", sd["embed_tokens.weight"])]
    for l in range(cfg.layers):
        p, q = f"layers.{l}.", R + f"layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                  "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj"):
            out.append((q + n + ".weight", sd[p + n]))
        attn = {k[len(p + "self_attn."):]: v for k, v in sd.items() if k.startswith(p + "self_attn.")}
        if cfg.is_mla(l):
            names = ["q_a_proj.weight", "q_a_layernorm", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                     "kv_a_layernorm", "kv_b_proj.weight", "g_proj.weight", "o_proj.weight"]
        else:
            names = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d", "k_conv1d", "v_conv1d",
                     "f_a_proj.weight", "f_b_proj.weight", "b_proj.weight", "dt_bias", "A_log", "o_norm",
                     "g_proj.weight", "o_proj.weight"]
        assert len(names) == len(attn), (l, sorted(attn))
        for n in names:
            rel = n if n.endswith(".weight") or n in ("dt_bias", "A_log") else n + ".weight"
            out.append((q + "self_attn." + rel, attn[n]))
        if l == 0:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out.append((q + f"mlp.{n}.weight", sd[p + f"mlp.{n}.weight"]))
        else:
            m, mq = p + "mlp.", q + "block_sparse_moe."
            out.append((mq + "gate.weight", sd[m + "gate.weight"]))
            out.append((mq + "gate.e_score_correction_bias", sd[m + "e_score_correction_bias"]))
            out.append((mq + "routed_expert_down_proj.weight", sd[m + "routed_expert_down_proj.weight"]))
            out.append((mq + "routed_expert_norm.weight", sd[m + "routed_expert_norm"]))
            out.append((mq + "routed_expert_up_proj.weight", sd[m + "routed_expert_up_proj.weight"]))
            for e in range(cfg.experts):
                for w in ("w1", "w3", "w2"):
                    out.append((mq + f"experts.{e}.{w}", ("mxfp4", sd[m + w][e])))
            for n in ("gate_proj", "up_proj", "down_proj"):
                out.append((mq + f"shared_experts.{n}.weight", sd[m + f"shared_experts.{n}.weight"]))
    out.append((R + "norm.weight", sd["norm"]))
    out.append((R + "output_attn_res_norm.weight", sd["output_attn_res_norm"]))
    out.append((R + "output_attn_res_proj.weight", sd["output_attn_res_proj"]))
    out.append(("language_model.lm_head.weight", sd["lm_head.weight"]))
    return out


def vision_tensors(cfg):
    """loader/vision_config.cpp vision_tensors(): names and shapes; seeded random bf16 values (untrained)."""
    v = VISION
    hid, ps, merged = v["vt_hidden"], v["vt_patch"], 4 * v["vt_hidden"]
    shapes = [("vision_tower.patch_embed.proj.weight", [hid, 3, ps, ps]),
              ("vision_tower.patch_embed.pos_emb.weight", [v["vt_pos_grid"], v["vt_pos_grid"], hid])]
    for i in range(v["vt_layers"]):
        p = f"vision_tower.encoder.blocks.{i}."
        shapes += [(p + "norm0.weight", [hid]), (p + "norm1.weight", [hid]),
                   (p + "wqkv.weight", [3 * v["vt_qkv"], hid]), (p + "wo.weight", [hid, v["vt_qkv"]]),
                   (p + "mlp.fc0.weight", [v["vt_intermediate"], hid]), (p + "mlp.fc1.weight", [hid, v["vt_intermediate"]])]
    shapes += [("vision_tower.encoder.final_layernorm.weight", [hid]), ("mm_projector.proj.0.weight", [merged, merged]),
               ("mm_projector.proj.2.weight", [cfg.hidden, merged]), ("mm_projector.post_norm.weight", [cfg.hidden])]
    g = torch.Generator().manual_seed(1)
    out = []
    for name, shape in shapes:
        if len(shape) == 1:
            t = 1.0 + 0.1 * (2 * torch.rand(shape, generator=g) - 1)
        else:
            fan_in = 1 if "pos_emb" in name else math.prod(shape[1:])
            t = (2 * torch.rand(shape, generator=g) - 1) / math.sqrt(fan_in)
        out.append((name, t.to(torch.bfloat16)))
    return out


def config_json(cfg):
    V = cfg.vocab
    kda = [l + 1 for l in range(cfg.layers) if not cfg.is_mla(l)]
    text = {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": V,
        "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.mla_heads,
        "num_key_value_heads": cfg.mla_heads, "intermediate_size": cfg.intermediate, "hidden_act": "situ",
        "rms_norm_eps": 1e-5, "max_position_embeddings": 1048576, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_experts": cfg.experts, "num_experts_per_token": cfg.top_k, "num_shared_experts": cfg.shared,
        "moe_intermediate_size": cfg.moe_inter, "moe_router_activation_func": "sigmoid", "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True, "routed_scaling_factor": 1.0,
        "q_lora_rank": cfg.q_lora, "kv_lora_rank": cfg.kv_lora, "qk_nope_head_dim": cfg.nope,
        "qk_rope_head_dim": cfg.rope, "v_head_dim": cfg.v_dim, "mla_use_nope": True, "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False, "bos_token_id": V - 256, "eos_token_id": V - 254, "pad_token_id": V - 1,
        "linear_attn_config": {"num_heads": cfg.kda_heads, "head_dim": cfg.head_dim, "short_conv_kernel_size": 4,
                               "full_attn_layers": list(cfg.full_attn_layers), "kda_layers": kda,
                               "use_full_rank_gate": True, "gate_lower_bound": cfg.gate_lower_bound},
        "dtype": "bfloat16", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "attn_res_block_size": cfg.attn_res_block, "routed_expert_hidden_size": cfg.latent,
        "latent_moe_use_norm": True, "mla_use_output_gate": True, "topk_method": "noaux_tc",
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "float", "group_size": 32,
                                                      "strategy": "group", "symmetric": True,
                                                      "scale_dtype": "torch.uint8"}}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]},
    }
    v = VISION
    vision = {"patch_size": v["vt_patch"], "init_pos_emb_height": v["vt_pos_grid"], "init_pos_emb_width": v["vt_pos_grid"],
              "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed", "pos_emb_interpolation_mode": "bilinear",
              "vt_num_hidden_layers": v["vt_layers"], "vt_hidden_size": v["vt_hidden"],
              "vt_intermediate_size": v["vt_intermediate"], "vt_num_attention_heads": v["vt_heads"],
              "qkv_hidden_size": v["vt_qkv"], "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool",
              "mm_projector_type": "patchmergerv2", "mm_hidden_size": v["vt_hidden"], "projector_hidden_act": "gelu",
              "projector_ln_eps": 1e-5, "text_hidden_size": cfg.hidden, "norm_type": "rmsnorm", "mlp_type": "mlp2",
              "activation_func": "gelu_pytorch_tanh", "attn_bias": False, "linear_bias": False,
              "patch_embed_proj_bias": False}
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "bos_token_id": V - 256,
            "eos_token_id": V - 254, "pad_token_id": V - 1, "tie_word_embeddings": False, "dtype": "bfloat16",
            "text_config": text, "vision_config": vision}


def export(cfg, sd, out, vocab_dir, shards=3, bf16_experts=False):
    tensors = []
    for name, t in released_tensors(cfg, sd):
        if isinstance(t, tuple) and bf16_experts:  # comparison checkpoint (kestrel quantize --compare)
            tensors.append((name + ".weight", t[1].to(torch.bfloat16).contiguous()))
        elif isinstance(t, tuple):
            packed, scale = mxfp4_quantize(t[1].float())
            tensors += [(name + ".weight_packed", packed), (name + ".weight_scale", scale)]
        elif name.endswith(F32_SUFFIXES):
            tensors.append((name, t.float().contiguous()))
        else:
            tensors.append((name, t.to(torch.bfloat16).contiguous()))
    tensors += vision_tensors(cfg)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(out, f))
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    weight_map, cur, acc, idx = {}, {}, 0, 0
    name_of = lambda i: f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
    for i, (n, t) in enumerate(tensors):
        acc += t.numel() * t.element_size()
        cur[n] = t
        weight_map[n] = name_of(idx)
        if i + 1 == len(tensors) or (idx + 1 < shards and acc >= total * (idx + 1) // shards):
            save_file(cur, os.path.join(out, name_of(idx)), {"format": "pt"})
            cur, idx = {}, idx + 1
    assert idx == shards
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    cj = config_json(cfg)
    if bf16_experts:
        del cj["text_config"]["quantization_config"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
        f.write("\n")
    for f in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(vocab_dir, f), os.path.join(out, f))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="directory with train.py's weights-*.safetensors")
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--bf16-experts", action="store_true",
                    help="routed experts in bf16 (not the shipped form: the reference for kestrel quantize --compare)")
    a = ap.parse_args()
    cfg, sd = load_weights(a.weights)
    total = export(cfg, sd, a.out, a.vocab, a.shards, a.bf16_experts)
    print(f"export: {total / 1e6:.1f} MB of tensors -> {a.out}")


if __name__ == "__main__":
    main()
