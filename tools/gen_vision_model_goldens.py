#!/usr/bin/env python3
"""Golden logits of a whole tiny Kimi K3 with a vision tower (tower + projector + text model) for a prompt with two
images of different sizes, from an INDEPENDENT pipeline of two references:

  * images -> embeddings: sglang 0.5.23's KimiK3VisionTower + KimiK3MultiModalProjector (loaded from its PyPI
    wheel behind the stubs of tools/gen_vision_tower_goldens.py), cross-checked by tools/vision_tower_torch_ref.py;
  * embeddings -> logits: llama.cpp's Kimi K3 text model (the llama.cpp vendored in llama-cpp-python 0.3.36,
    the reference of tools/gen_k3_goldens.py), fed the prompt as input embeddings (llama_batch.embd): each text
    position gets its row of the checkpoint's embed_tokens (the f32 GGUF's token_embd holds the same values),
    each <|media_pad|> position the next projected image row, in order.

Needs what both references need, installed next to the repository: torch, safetensors and sglang==0.5.23
(`pip install --no-deps`), llama-cpp-python 0.3.36 built from its sdist, and its vendored llama.cpp tree for the
converter (see the two scripts above). Run from the repository root:

    TORCHDYNAMO_DISABLE=1 <venv>/bin/python tools/gen_vision_model_goldens.py --kestrel build/release/kestrel \\
        --llama-cpp-src <sdist>/vendor/llama.cpp --out tests/data/vision/model_two_images.safetensors

Pipeline:
  1. `kestrel make-model --preset k3-tiny-bf16` with the tower flags of MAKE_MODEL_FLAGS (q/k/v width 96 != tower
     width 64, as in K3); BF16 experts, so llama.cpp runs f32 throughout.
  2. Two images of different sizes, GRIDS = 8x8 patches (the position grid's own size; 16 tokens) and 2x6
     (interpolated; 3 tokens), pixel values from the integer hash of gen_vision_tower_goldens.pixel_values (the C++
     test re-computes them); both references encode them as one batch; they must agree within
     gen_vision_tower_goldens.TRANSCRIPTION_BOUND.
  3. The prompt (`build_prompt`): text ids, then per image the expanded placeholder
     `<|media_begin|>` + 3 text ids ("image WxH") + `<|media_content|>` + N x `<|media_pad|>` + `<|media_end|>`
     with K3's special ids of the tiny vocabulary (first special id + 18, 19, 21, 20), then text ids.
  4. llama.cpp on the f32 GGUF (f32 KV), one batch of input embeddings, logits at every position.
     Self-consistency (metadata): the same prompt with the pads as plain tokens, fed as token ids vs as their
     embedding rows (equal bits: the embedding path is the token path); and the logits with the transcription's
     image rows instead of sglang's (how far image-row noise of this size moves the logits).
Output (safetensors): prompt I32 [n]; grids I32 [2, 3]; media F32 [tokens, 256] (sglang's projected rows);
logits F32 [n, vocab]. Metadata: references, command, make-model flags, self-consistency numbers.
"""
import argparse
import ctypes
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
import gen_k3_goldens as k3  # noqa: E402
import gen_vision_tower_goldens as tower_gold  # noqa: E402
import vision_tower_torch_ref  # noqa: E402
from golden_command import recorded_command  # noqa: E402

PRESET = "k3-tiny-bf16"
MAKE_MODEL_FLAGS = ["--vt-heads", "3", "--vt-qkv", "96"]
GRIDS = [(1, 8, 8), (1, 2, 6)]
MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_END, MEDIA_PAD = 18, 19, 20, 21  # offsets from the first special id (K3)


def build_prompt(first_special, tokens_per_image, seed):
    rng = np.random.RandomState(seed)
    text = lambda n: [int(t) for t in rng.randint(0, first_special, n)]  # noqa: E731
    ids = text(4)
    for n in tokens_per_image:
        ids += [first_special + MEDIA_BEGIN] + text(3) + [first_special + MEDIA_CONTENT]
        ids += [first_special + MEDIA_PAD] * n + [first_special + MEDIA_END] + text(3)
    return np.array(ids + text(2), dtype=np.int32)


def encode_images(weights, vision_config):
    tower_gold.install_stubs()
    tower_gold.load_sglang_file("sglang.srt.models.kimi_vl_moonvit", "sglang/srt/models/kimi_vl_moonvit.py")
    k3vl = tower_gold.load_sglang_file("sglang.srt.models.kimi_k3_vl", "sglang/srt/models/kimi_k3_vl.py")
    cfg = types.SimpleNamespace(**vision_config)
    tower = k3vl.KimiK3VisionTower(cfg).float().eval()
    projector = k3vl.KimiK3MultiModalProjector(cfg).float().eval()
    tower.load_state_dict({k[len("vision_tower."):]: v for k, v in weights.items() if k.startswith("vision_tower.")},
                          strict=True)
    projector.load_state_dict({k[len("mm_projector."):]: v for k, v in weights.items()
                               if k.startswith("mm_projector.")}, strict=True)
    patch = vision_config["patch_size"]
    pv = torch.from_numpy(np.concatenate([tower_gold.pixel_values(i, t * h * w, patch)
                                          for i, (t, h, w) in enumerate(GRIDS)]))
    with torch.no_grad():
        media = projector(tower(pv, torch.tensor(GRIDS, dtype=torch.int64)))
        _, _, media_t = vision_tower_torch_ref.forward(weights, vision_config, pv, GRIDS)
    agreement = tower_gold.stage_agreement(media_t, media)
    bound = tower_gold.TRANSCRIPTION_BOUND
    if not (agreement["max_abs_diff"] <= bound["rel_max_abs"] * agreement["max_abs_ref"]
            and agreement["cosine"] >= 1 - bound["one_minus_cosine"]):
        sys.exit(f"the torch transcription disagrees with sglang on the image rows: {agreement}")
    return media.numpy().astype(np.float32), media_t.numpy().astype(np.float32), agreement


def llama_logits(llama_cpp, gguf, rows, args):
    """llama.cpp logits at every position for a prompt given as input embeddings [n, hidden]."""
    llm = k3.load_llama(llama_cpp, gguf, args)
    n, d = rows.shape
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    batch = llama_cpp.llama_batch_init(n, d, 1)
    try:
        ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
        for i in range(n):
            batch.pos[i], batch.n_seq_id[i], batch.logits[i] = i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = n
        if llama_cpp.llama_decode(llm.ctx, batch) != 0:
            sys.exit("llama_decode failed on the embedding batch")
        vocab = llm.n_vocab()
        out = np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, i), shape=(vocab,)).copy()
                        for i in range(n)])
    finally:
        llama_cpp.llama_batch_free(batch)
        llm.close()
    return out.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", required=True, help="the kestrel binary (make-model)")
    ap.add_argument("--llama-cpp-src", required=True, help="vendored llama.cpp tree (convert_hf_to_gguf.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0, help="prompt text ids: numpy RandomState seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if os.environ.get("TORCHDYNAMO_DISABLE") != "1":
        sys.exit("run with TORCHDYNAMO_DISABLE=1 (the reference wraps a helper in torch.compile)")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    import importlib.metadata
    if importlib.metadata.version("sglang") != "0.5.23":
        sys.exit("the goldens are defined against sglang 0.5.23")
    import llama_cpp  # the reference build (llama-cpp-python)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, gguf = os.path.join(tmp, "model"), os.path.join(tmp, "model-f32.gguf")
        subprocess.run([args.kestrel, "make-model", "--preset", PRESET, *MAKE_MODEL_FLAGS, "--out", model_dir],
                       check=True)
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        weights, embed_tokens = {}, None
        for name in sorted(os.listdir(model_dir)):
            if name.endswith(".safetensors"):
                for k, v in load_file(os.path.join(model_dir, name)).items():
                    if k.startswith(("vision_tower.", "mm_projector.")):
                        weights[k] = v.float()
                    elif k.endswith("embed_tokens.weight"):
                        embed_tokens = v.float().numpy()
        env = dict(os.environ)
        env.pop("NO_LOCAL_GGUF", None)
        k3.run([sys.executable, "-c", k3.CONVERT_SNIPPET, args.llama_cpp_src, model_dir, gguf], env=env,
               stdout=None if args.verbose else subprocess.DEVNULL)

        vision_config = config["vision_config"]
        media, media_t, agreement = encode_images(weights, vision_config)
        first_special = int(config["text_config"]["bos_token_id"])
        pad = first_special + MEDIA_PAD
        if int(config["media_placeholder_token_id"]) != pad:
            sys.exit(f"media_placeholder_token_id {config['media_placeholder_token_id']} != {pad}")
        tokens = [(h // 2) * (w // 2) for _, h, w in GRIDS]
        prompt = build_prompt(first_special, tokens, args.seed)
        pads = np.flatnonzero(prompt == pad)
        assert len(pads) == media.shape[0] == sum(tokens)

        rows = embed_tokens[prompt].copy()
        text_only = llama_logits(llama_cpp, gguf, rows, args)
        llm = k3.load_llama(llama_cpp, gguf, args)
        llm.eval([int(t) for t in prompt])
        token_path = np.array(llm.scores[: len(prompt)], dtype=np.float32, copy=True)
        llm.close()
        embd_vs_tokens = float(np.max(np.abs(text_only - token_path)))
        rows[pads] = media
        logits = llama_logits(llama_cpp, gguf, rows, args)
        rows[pads] = media_t
        logits_t = llama_logits(llama_cpp, gguf, rows, args)
    image_moves = float(np.max(np.abs(logits - text_only)[pads[0]:]))
    transcription_rows_move = float(np.max(np.abs(logits_t - logits)))
    assert np.all(np.isfinite(logits))

    meta = {
        "reference": "images: sglang 0.5.23 (PyPI) kimi_k3_vl.py KimiK3VisionTower + KimiK3MultiModalProjector, "
                     "fp32 CPU; text: llama.cpp (llama-cpp-python " + getattr(llama_cpp, "__version__", "?") +
                     " vendored) kimi-k3, f32 GGUF, f32 KV, prompt as input embeddings",
        "torch": torch.__version__,
        "command": recorded_command("gen_vision_model_goldens.py"),
        "checkpoint": f"kestrel make-model --preset {PRESET} " + " ".join(MAKE_MODEL_FLAGS),
        "preset": PRESET,
        "make_model_flags": json.dumps(MAKE_MODEL_FLAGS),
        "pixel_values": "gen_vision_tower_goldens.pixel_values(image_index, patches, patch), images in grid order",
        "prompt": f"build_prompt(first special id {first_special}, tokens {tokens}, seed {args.seed})",
        "self_consistency_embd_vs_token_ids_max_abs": repr(embd_vs_tokens),
        "image_rows_move_logits_max_abs": repr(image_moves),
        "transcription_rows_vs_reference_rows": json.dumps(agreement),
        "logits_with_transcription_rows_max_abs_diff": repr(transcription_rows_move),
        "max_abs_logit": repr(float(np.max(np.abs(logits)))),
    }
    out = {"prompt": prompt, "grids": np.array(GRIDS, dtype=np.int32), "media": media, "logits": logits}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(out, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes): prompt {len(prompt)}, image tokens {tokens}; "
          f"embedding path vs token ids {embd_vs_tokens:.3g}; the images move logits by up to {image_moves:.3g}; "
          f"transcription rows vs sglang rows {agreement}, logits move {transcription_rows_move:.3g}")


if __name__ == "__main__":
    main()
