"""`kestrel quantize` end to end, checked with compressed-tensors (the independent reference):

* k3-tiny-bf16 and kimi-linear-tiny are quantized to W4A8 (group 32) with --report --json;
* compressed-tensors parses our quantization_config, and every W4A8 module matches exactly one of
  its config-group targets (and no ignore entry);
* for every quantized module, compressed-tensors' own calculate_qparams + PackedQuantizationCompressor
  applied to the original bf16 weight produce bit-identical weight_packed / weight_scale, and its
  decompress of our file stays within half a quantization step of the original;
* a fake-quantized F32 checkpoint built from compressed-tensors' decompress (exact q·scale) runs in
  our engine and gives exactly the logits of our W4A8 checkpoint in weight-only mode
  (KESTREL_W4A8_WEIGHT_ONLY=1: same weights, same fp32 arithmetic) — so the binding and in-kernel
  dequantization of every quantized tensor are right;
* the accuracy report is sane: KL > 0 (the weights did change), and — on these random-weight
  models, which amplify any perturbation through depth (see docs/PERFORMANCE.md) — bounded;
* the quantized checkpoint generates, and `quantize` on an already quantized checkpoint is a
  one-line error.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

import torch  # noqa: E402  (reference environment: torch + compressed-tensors; see tests/reference/README.md)
import compressed_tensors as ct  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))


def run(args, env=None):
    p = subprocess.run([BIN, *args], capture_output=True, env=env or ENV, timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    return p


def load_dir(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            for k, v in load_file(os.path.join(d, f)).items():
                out[k] = (v, f)
    return out


def quant_config(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    return cfg["text_config"]["quantization_config"] if "text_config" in cfg else cfg["quantization_config"]


def matches(pattern, name):
    return re.match(pattern[3:], name) is not None if pattern.startswith("re:") else pattern == name


@pytest.mark.parametrize("preset", ["k3-tiny-bf16", "kimi-linear-tiny"])
def test_quantize_matches_compressed_tensors(preset):
    with tempfile.TemporaryDirectory() as tmp:
        src, q, fq = (os.path.join(tmp, n) for n in ("src", "q", "fq"))
        run(["make-model", "--preset", preset, "--out", src])
        rep = json.loads(run(["quantize", "--model", src, "--out", q, "--report", "--json"]).stdout)
        assert rep["group_size"] == 32 and rep["quantized_tensors"] > 50 and rep["bytes_out"] < rep["bytes_in"] / 2
        r = rep["report"]
        assert r["positions"] == 8 * 64
        assert 0 < r["kl_mean"] < 1.0 and r["kl_max"] < 3.0 and r["top1_agreement"] > 0.05

        qc = quant_config(q)
        parsed = QuantizationConfig.model_validate(qc)
        assert parsed.format == "pack-quantized" and parsed.quantization_status == "compressed"
        (group,) = parsed.config_groups.values()
        assert group.weights.num_bits == 4 and group.weights.group_size == 32 and group.weights.symmetric
        assert group.input_activations.num_bits == 8 and group.input_activations.strategy == "token"
        assert group.input_activations.dynamic

        ours, orig = load_dir(q), load_dir(src)
        modules = sorted(k[: -len(".weight_packed")] for k in ours if k.endswith(".weight_packed"))
        assert len(modules) == rep["quantized_tensors"]
        fake = {f: {} for _, f in orig.values()}
        for name, (t, f) in orig.items():
            fake[f][name] = t
        for m in modules:
            assert sum(matches(p, m) for p in group.targets) == 1, m
            assert not any(matches(p, m) for p in parsed.ignore), m
            w = orig[m + ".weight"][0]
            assert w.dtype == torch.bfloat16
            packed, scale, shape = (ours[m + s][0] for s in (".weight_packed", ".weight_scale", ".weight_shape"))
            assert shape.tolist() == list(w.shape)
            wg = w.reshape(w.shape[0], -1, 32)
            ref_scale, zp = calculate_qparams(wg.amin(dim=-1), wg.amax(dim=-1), group.weights)
            comp = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": ref_scale, "weight_zero_point": zp},
                                                          group)
            assert torch.equal(scale, ref_scale), m
            assert torch.equal(packed, comp["weight_packed"]), m
            dec = PackedQuantizationCompressor.decompress(
                {"weight_packed": packed, "weight_scale": scale.float(), "weight_shape": shape}, group)["weight"]
            # Half a step, plus what the bf16 roundings add (scale = bf16(absmax/7.5) may sit below
            # absmax/7.5, and w/scale is rounded to bf16 before rounding to an integer: ≤ 2^-5 step).
            step = scale.float().repeat_interleave(32, dim=1)
            assert bool(((dec - w.float()).abs() <= (0.5 + 2 ** -5) * step).all()), m
            fake[orig[m + ".weight"][1]][m + ".weight"] = dec.contiguous()  # F32: exact q·scale
        os.makedirs(fq)
        for f, tensors in fake.items():
            save_file(tensors, os.path.join(fq, f), metadata={"format": "pt"})
        for f in os.listdir(src):
            if not f.endswith(".safetensors"):
                shutil.copy(os.path.join(src, f), fq)

        # Same weights (ours decoded in-kernel vs compressed-tensors' exact fp32 dequantization stored as
        # F32), same fp32 arithmetic: the logits must agree to the last bit.
        env = dict(ENV, KESTREL_W4A8_WEIGHT_ONLY="1")
        cmp = json.loads(run(["quantize", "--model", fq, "--compare", q, "--json"], env=env).stdout)["report"]
        assert cmp["kl_max"] == 0.0 and cmp["top1_agreement"] == 1.0, cmp

        gen = json.loads(run(["generate", "--model", q, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--json"]).stdout)
        assert len(gen["tokens"]) == 4
        again = subprocess.run([BIN, "quantize", "--model", q, "--out", os.path.join(tmp, "q2")], capture_output=True,
                               env=ENV, timeout=120)
        assert again.returncode == 1 and b"already int4 pack-quantized" in again.stderr
        assert again.stderr.count(b"\n") == 1  # the one-line error (no progress lines when stderr is not a terminal)


def test_mxfp4_experts_kept_mixed_precision():
    with tempfile.TemporaryDirectory() as tmp:
        src, q = os.path.join(tmp, "src"), os.path.join(tmp, "q")
        run(["make-model", "--preset", "k3-tiny", "--out", src])
        rep = json.loads(run(["quantize", "--model", src, "--out", q, "--group-size", "64", "--json"]).stdout)
        assert rep["mxfp4_tensors_kept"] > 0 and rep["quantized_tensors"] > 0
        parsed = QuantizationConfig.model_validate(quant_config(q))
        assert parsed.format == "mixed-precision"
        fmts = sorted(g.format for g in parsed.config_groups.values())
        assert fmts == ["mixed-precision", "pack-quantized"] or fmts == ["mxfp4-pack-quantized", "pack-quantized"]
        ours, orig = load_dir(q), load_dir(src)
        for k, (t, _) in orig.items():
            if k.endswith(".weight_packed"):  # MXFP4 bytes copied as is
                assert torch.equal(ours[k][0], t)
        run(["generate", "--model", q, "--prompt-ids", "1,2,3", "--max-tokens", "2"])
