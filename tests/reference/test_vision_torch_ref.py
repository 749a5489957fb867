"""The minimal torch transcription of the K3 vision tower (tools/vision_tower_torch_ref.py) against the committed
sglang goldens of tests/data/vision, without sglang: for every tower golden, the checkpoint is regenerated with
`kestrel make-model` from the flags in its metadata, the transcription runs on the same hashed pixels, and every
stage the golden stores must agree with sglang's within the generator's bound (TRANSCRIPTION_BOUND); its projector
output must equal the golden's `projected_transcription` to fp32 noise of the same bound. Needs torch and
safetensors (the reference environment, see README.md)."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch  # noqa: E402  (reference environment)
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_vision_tower_goldens as gold  # noqa: E402
import vision_tower_torch_ref  # noqa: E402

BIN = os.environ.get("KESTREL_BINARY", os.path.join(ROOT, "build", "release", "kestrel"))
GOLDENS = ["tower_tiny", "tower_real_widths", "tower_real_27_blocks", "tower_projector_7168"]


def close(mine, ref):
    a = gold.stage_agreement(torch.from_numpy(mine), torch.from_numpy(ref))
    b = gold.TRANSCRIPTION_BOUND
    return a["max_abs_diff"] <= b["rel_max_abs"] * a["max_abs_ref"] and a["cosine"] >= 1 - b["one_minus_cosine"], a


@pytest.mark.parametrize("name", GOLDENS)
def test_transcription_matches_the_sglang_golden(name):
    path = os.path.join(ROOT, "tests", "data", "vision", name + ".safetensors")
    with safe_open(path, "np") as f:
        meta = f.metadata()
        golden = {k: f.get_tensor(k) for k in f.keys()}
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([BIN, "make-model", "--preset", "k3-tiny", *json.loads(meta["make_model_flags"]),
                        "--out", model], check=True, capture_output=True)
        with open(os.path.join(model, "config.json")) as f:
            vision_config = json.load(f)["vision_config"]
        weights = {}
        for shard in sorted(os.listdir(model)):
            if shard.endswith(".safetensors"):
                weights.update({k: v for k, v in load_file(os.path.join(model, shard)).items()
                                if k.startswith(("vision_tower.", "mm_projector."))})
    grids = [tuple(int(x) for x in g) for g in golden["grids"]]
    patch = vision_config["patch_size"]
    pv = torch.from_numpy(np.concatenate([gold.pixel_values(i, t * h * w, patch) for i, (t, h, w) in enumerate(grids)]))
    with torch.no_grad():
        out = dict(zip(["embed", "merged", "projected"],
                       (t.numpy() for t in vision_tower_torch_ref.forward(weights, vision_config, pv, grids))))
    checked = 0
    for stage in ["embed", "merged", "projected"]:
        if stage in golden:
            ok, a = close(out[stage], golden[stage])
            assert ok, f"{name} {stage}: {a}"
            checked += 1
    assert checked >= 1
    ok, a = close(out["projected"], golden["projected_transcription"])
    assert ok, f"{name} projected_transcription: {a}"
