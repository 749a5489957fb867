#!/usr/bin/env python3
"""Golden outputs of the Kimi K3 vision tower + projector from an INDEPENDENT reference: sglang's port.

Reference: sglang 0.5.23 from PyPI, `sglang/srt/models/kimi_k3_vl.py` (KimiK3VisionTower,
KimiK3MultiModalProjector; a port of the checkpoint's modeling_kimi_k3.py that keeps the released tensor names)
and `sglang/srt/models/kimi_vl_moonvit.py` (tpool_patch_merger). Nothing of sglang lives in this repository; it is
installed next to it, without its dependencies (they pull CUDA packages), in a venv that has torch and safetensors:

    pip install --no-deps sglang==0.5.23

The two files are loaded by path from the installed package. Their imports of other sglang modules (Triton RoPE,
flash-attention backends, distributed linears, runtime config) are served by the small stubs below, which hold
only what the CPU path asks for; on a CPU the tower picks PyTorch SDPA by itself and never calls a stubbed
kernel. The stubs are this script's own code.

Run (from the repository root), once per tower config:

    TORCHDYNAMO_DISABLE=1 <venv>/bin/python tools/gen_vision_tower_goldens.py --kestrel build/release/kestrel \\
        --widths tiny --out tests/data/vision/tower_tiny.safetensors
    TORCHDYNAMO_DISABLE=1 <venv>/bin/python tools/gen_vision_tower_goldens.py --kestrel build/release/kestrel \\
        --widths real --out tests/data/vision/tower_real_widths.safetensors
    TORCHDYNAMO_DISABLE=1 <venv>/bin/python tools/gen_vision_tower_goldens.py --kestrel build/release/kestrel \\
        --widths real27 --out tests/data/vision/tower_real_27_blocks.safetensors
    TORCHDYNAMO_DISABLE=1 <venv>/bin/python tools/gen_vision_tower_goldens.py --kestrel build/release/kestrel \\
        --widths real7168 --out tests/data/vision/tower_projector_7168.safetensors

Pipeline:
  1. `kestrel make-model --preset k3-tiny` with the tower flags of CONFIGS below: "tiny" has 3 heads x 32 so that
     the q/k/v width (96) differs from the tower width (64) as in K3; "real" has K3's tower widths (1024, q/k/v
     1536 = 12 x 128, MLP 4096, 64 x 64 position grid) with 2 of the 27 blocks, and a projector from 4096 to the
     tiny text width (256); "real27" is the same with all 27 blocks (a checkpoint of about 0.8 GB, generated and
     deleted; only the outputs are kept); "real7168" is "real" with K3's text width 7168 (`--hidden 7168`), so
     the projector ends at the released width. The flags are stored in the golden's metadata; the C++ test
     generates the same checkpoint from them.
  2. The tower and projector built from the checkpoint's vision_config and loaded name for name (bf16 -> fp32).
  3. The images of CONFIGS as ONE batch (for "tiny": 8x8, the position grid's own size, and 2x4, 6x2,
     interpolated; for "real": 4x4 and 2x6, interpolated from 64x64; for "real27": one 4x4 image; for
     "real7168": one 2x4 image); pixel values from an integer hash (`pixel_values` below, re-computed by the C++
     test) so the golden holds no input pixels.
  4. Cross-check: tools/vision_tower_torch_ref.py, a second, minimal plain-torch transcription (no sglang code), on
     the same weights and pixels; the script exits without writing unless it agrees with sglang at every stage
     within TRANSCRIPTION_BOUND. The per-stage agreement goes into the metadata.
Output (safetensors), the stages of CONFIGS' "stored" (all by default): grids I32 [images, 3]; embed F32
[patches, hidden] (patch embedding + position grid); merged F32 [tokens, 4 * hidden] (tower output after the final
norm and the 2x2 merger); projected F32 [tokens, text width] (projector output); projected_transcription F32
[tokens, text width] (the same from step 4, always stored).
fp32 everywhere, 2 threads, deterministic algorithms.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_command import recorded_command  # noqa: E402
import vision_tower_torch_ref  # noqa: E402

CONFIGS = {
    "tiny": dict(flags=["--vt-heads", "3", "--vt-qkv", "96"], grids=[(1, 8, 8), (1, 2, 4), (1, 6, 2)]),
    "real": dict(flags=["--vt-layers", "2", "--vt-hidden", "1024", "--vt-intermediate", "4096", "--vt-heads", "12",
                        "--vt-qkv", "1536", "--vt-pos-grid", "64"], grids=[(1, 4, 4), (1, 2, 6)]),
    "real27": dict(flags=["--vt-layers", "27", "--vt-hidden", "1024", "--vt-intermediate", "4096",
                          "--vt-heads", "12", "--vt-qkv", "1536", "--vt-pos-grid", "64"],
                   grids=[(1, 4, 4)], stored=["merged", "projected"]),
    "real7168": dict(flags=["--hidden", "7168", "--vt-layers", "2", "--vt-hidden", "1024", "--vt-intermediate",
                            "4096", "--vt-heads", "12", "--vt-qkv", "1536", "--vt-pos-grid", "64"],
                     grids=[(1, 2, 4)], stored=["projected"]),
}


# Agreement required between the two references, per stage: both are fp32 PyTorch on the same fp32 weights and
# differ only in summation order (SDPA vs one softmax pass, the conv vs one matrix product, F.interpolate vs the
# hand-written bilinear) and in libm-level functions; the same bound as Kestrel's against the reference.
TRANSCRIPTION_BOUND = {"rel_max_abs": 1e-5, "one_minus_cosine": 1e-10}


def stage_agreement(mine, ref):
    mine, ref = mine.double(), ref.double()
    return {"max_abs_diff": float((mine - ref).abs().max()), "max_abs_ref": float(ref.abs().max()),
            "cosine": float((mine * ref).sum() / (mine.norm() * ref.norm()))}


def pixel_values(image_index, patches, patch):
    """[patches, 3, patch, patch] float32 values (u - 127.5) / 127.5 with u a byte of an integer hash."""
    k = np.arange(patches * 3 * patch * patch, dtype=np.uint64)
    h = ((np.uint64(image_index) * np.uint64(1000003) + k) * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    u = (h >> np.uint64(24)).astype(np.float64)
    return ((u - 127.5) / 127.5).astype(np.float32).reshape(patches, 3, patch, patch)


# ---- stubs for the sglang modules the two files import (CPU path only) -----------------------------------
class _Unavailable:
    """Stand-in for a GPU/distributed class: constructing one is an error (the CPU path never does)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is a stub: not available on the CPU reference path")


def _stub_module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package, so that submodules can be stubbed too
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class _AttentionMetadata:
    def __init__(self, cu_seqlens):
        self.cu_seqlens = cu_seqlens
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        self.max_seqlen = max(lengths) if lengths else 0


def _no_mm_config():
    raise ValueError("no runtime multimodal config (reference run)")  # the tower then picks "auto" -> sdpa


def _concat_or_single(items):
    return items[0] if len(items) == 1 else torch.cat(items)


def install_stubs():
    for name in ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention", "sglang.srt",
                 "sglang.srt.layers", "sglang.srt.layers.attention", "sglang.srt.models", "sglang.srt.multimodal",
                 "sglang.srt.layers.quantization.modelslim"]:
        _stub_module(name)

    def gpu_only(*args, **kwargs):
        raise RuntimeError("GPU kernel stub called on the CPU reference path")

    _stub_module("sglang.kernels.ops.attention.vision_rope", apply_fused_qk_complex_rope=gpu_only,
                 can_use_fused_qk_complex_rope=lambda **kwargs: False, precompile_fused_qk_complex_rope=gpu_only)
    _stub_module("sglang.srt.environ", envs=types.SimpleNamespace())  # read only for CUDA inputs
    _stub_module("sglang.srt.layers.attention.vision", FLASHINFER_WORKSPACE_SIZE_BYTES=0, QKV_BACKEND_IMPL={},
                 VisionAttentionMetadata=_AttentionMetadata, VisionAttention=_Unavailable,
                 prepare_flashinfer_cudnn_vision_attention_metadata=gpu_only,
                 prepare_vision_attention_metadata=lambda cu_seqlens, device=None: _AttentionMetadata(cu_seqlens))
    _stub_module("sglang.srt.multimodal.mm_utils", concat_or_single=_concat_or_single)
    _stub_module("sglang.srt.runtime_context", get_mm=_no_mm_config, get_parallel=gpu_only)
    _stub_module("sglang.srt.utils", get_bool_env_var=lambda name, default="false": False, is_hip=lambda: False,
                 print_info_once=lambda *args, **kwargs: None, add_prefix=lambda name, prefix: name,
                 get_device=lambda *args, **kwargs: "cpu")
    _stub_module("sglang.srt.configs", MoonViTConfig=_Unavailable)
    _stub_module("sglang.srt.layers.conv", Conv2dLayer=_Unavailable)
    _stub_module("sglang.srt.layers.dp_attention", reject_attn_tp_shard_with_tp_reduce=gpu_only)
    _stub_module("sglang.srt.layers.linear", ColumnParallelLinear=_Unavailable, ReplicatedLinear=_Unavailable,
                 RowParallelLinear=_Unavailable)
    _stub_module("sglang.srt.layers.quantization", QuantizationConfig=_Unavailable)
    _stub_module("sglang.srt.layers.quantization.modelslim.modelslim", ModelSlimConfig=_Unavailable)


def load_sglang_file(module_name, relative_path):
    path = importlib.metadata.distribution("sglang").locate_file(relative_path)
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", required=True, help="the kestrel binary (make-model)")
    ap.add_argument("--widths", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if os.environ.get("TORCHDYNAMO_DISABLE") != "1":
        sys.exit("run with TORCHDYNAMO_DISABLE=1 (the reference wraps a helper in torch.compile)")
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    sglang_version = importlib.metadata.version("sglang")
    if sglang_version != "0.5.23":
        sys.exit(f"sglang {sglang_version} installed; the goldens are defined against 0.5.23")

    install_stubs()
    moonvit = load_sglang_file("sglang.srt.models.kimi_vl_moonvit", "sglang/srt/models/kimi_vl_moonvit.py")
    k3vl = load_sglang_file("sglang.srt.models.kimi_k3_vl", "sglang/srt/models/kimi_k3_vl.py")

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([args.kestrel, "make-model", "--preset", "k3-tiny", *CONFIGS[args.widths]["flags"],
                        "--out", model], check=True)
        with open(os.path.join(model, "config.json")) as f:
            vision_config = json.load(f)["vision_config"]
        weights = {}
        for name in sorted(os.listdir(model)):
            if name.endswith(".safetensors"):
                for k, v in load_file(os.path.join(model, name)).items():
                    if k.startswith(("vision_tower.", "mm_projector.")):
                        weights[k] = v.float()

    cfg = types.SimpleNamespace(**vision_config)
    tower = k3vl.KimiK3VisionTower(cfg).float().eval()
    projector = k3vl.KimiK3MultiModalProjector(cfg).float().eval()
    tower_sd = {k[len("vision_tower."):]: v for k, v in weights.items() if k.startswith("vision_tower.")}
    proj_sd = {k[len("mm_projector."):]: v for k, v in weights.items() if k.startswith("mm_projector.")}
    tower.load_state_dict(tower_sd, strict=True)
    projector.load_state_dict(proj_sd, strict=True)

    patch = vision_config["patch_size"]
    grid_list = CONFIGS[args.widths]["grids"]
    pv = torch.from_numpy(np.concatenate([pixel_values(i, t * h * w, patch) for i, (t, h, w) in enumerate(grid_list)]))
    grids = torch.tensor(grid_list, dtype=torch.int64)
    with torch.no_grad():
        embed = tower.patch_embed(pv, grids)
        merged_list = tower(pv, grids)
        merged = torch.cat([m.reshape(m.shape[0], -1) for m in merged_list])
        projected = projector(merged_list)
        # Self-check of the reference: each image alone gives what it gives in the batch (to fp32 noise).
        alone, start = [], 0
        for i, g in enumerate(grid_list):
            n = g[0] * g[1] * g[2]
            m = tower(pv[start:start + n], torch.tensor([g]))[0]
            alone.append(m.reshape(m.shape[0], -1))
            start += n
        alone_vs_batch = float((torch.cat(alone) - merged).abs().max())
    assert moonvit.tpool_patch_merger is k3vl.tpool_patch_merger

    # Cross-check: the second, minimal transcription (vision_tower_torch_ref.py, no sglang code) on the same
    # weights and pixels agrees with sglang at every stage within TRANSCRIPTION_BOUND, or nothing is written.
    with torch.no_grad():
        t_embed, t_merged, t_projected = vision_tower_torch_ref.forward(weights, vision_config, pv, grid_list)
    agreement = {stage: stage_agreement(mine, ref) for stage, mine, ref in
                 [("embed", t_embed, embed), ("merged", t_merged, merged), ("projected", t_projected, projected)]}
    for stage, a in agreement.items():
        if not (a["max_abs_diff"] <= TRANSCRIPTION_BOUND["rel_max_abs"] * a["max_abs_ref"]
                and a["cosine"] >= 1 - TRANSCRIPTION_BOUND["one_minus_cosine"]):
            sys.exit(f"the torch transcription disagrees with sglang at {stage}: {a}")

    meta = {
        "reference": f"sglang {sglang_version} (PyPI) sglang/srt/models/kimi_k3_vl.py KimiK3VisionTower + "
                     "KimiK3MultiModalProjector, kimi_vl_moonvit.py tpool_patch_merger; fp32, CPU, SDPA",
        "torch": torch.__version__,
        "command": recorded_command("gen_vision_tower_goldens.py"),
        "checkpoint": "kestrel make-model --preset k3-tiny " + " ".join(CONFIGS[args.widths]["flags"]),
        "make_model_flags": json.dumps(CONFIGS[args.widths]["flags"]),
        "pixel_values": "pixel_values(image_index, patches, patch) of this script, images in grid order",
        "reference_alone_vs_batch_max_abs": repr(alone_vs_batch),
        "transcription": "tools/vision_tower_torch_ref.py forward() (plain torch fp32, no sglang code); "
                         "projected_transcription is its projector output",
        "transcription_bound": json.dumps(TRANSCRIPTION_BOUND),
        "transcription_vs_reference": json.dumps(agreement),
    }
    out = {"grids": np.array(grid_list, dtype=np.int32), "embed": embed.numpy().astype(np.float32),
           "merged": merged.numpy().astype(np.float32), "projected": projected.numpy().astype(np.float32),
           "projected_transcription": t_projected.numpy().astype(np.float32)}
    for stage in {"embed", "merged", "projected"} - set(CONFIGS[args.widths].get("stored", ["embed", "merged",
                                                                                          "projected"])):
        del out[stage]  # checked at the "real" config already (the same computation): keeps the file small
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(out, args.out, metadata=meta)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {list(v.shape)}" for k, v in out.items()) +
          f"; reference alone vs batch max |diff| {alone_vs_batch:.3g}; "
          f"transcription vs reference {json.dumps(agreement)}")


if __name__ == "__main__":
    main()
