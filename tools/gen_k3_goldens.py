#!/usr/bin/env python3
"""Golden logits for tiny random Kimi K3 checkpoints from an INDEPENDENT reference: llama.cpp's Kimi K3 model.

Reference: the llama.cpp vendored in the PyPI package llama-cpp-python 0.3.36 (src/models/kimi-k3.cpp,
conversion/kimi_k3.py). Nothing of llama.cpp lives in this repository; it has to be installed next to it:

    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \\
        CMAKE_BUILD_PARALLEL_LEVEL=2 /work/venv/bin/pip install <unpacked llama_cpp_python-0.3.36 sdist>

and the converter (convert_hf_to_gguf.py of the same vendored tree) needs torch + transformers in the venv.

Run (from the repository root, with the project venv):

    /work/venv/bin/python tools/gen_k3_goldens.py --kestrel build/release/kestrel \\
        --llama-cpp-src <sdist>/vendor/llama.cpp --preset k3-tiny-bf16 \\
        --out tests/data/models/k3_tiny_bf16.safetensors

Pipeline:
  1. `kestrel make-model --preset P --out TMP/model`: random checkpoint in the released K3 layout.
  2. llama.cpp's convert_hf_to_gguf.py --outtype f32 (run in a subprocess). The tiny checkpoints ship no
     tokenizer, so the K3 model class's `set_vocab` is monkeypatched in-process to `_set_vocab_none`
     (dummy vocabulary, vocab size from the config); the vendored files are not edited.
  3. llama_cpp.Llama on the GGUF: f32 weights, f32 KV cache (type_k = type_v = GGML_TYPE_F32, so the MLA
     latent cache is not f16), logits for every position, CPU.
       * `logits`: all rows of one 200-token evaluation (one ubatch).
       * `greedy`: 32 greedy tokens (plain argmax, lowest id on ties, no stop at eos) after the first
         `greedy_prompt_len` = 65 prompt tokens, decoded one token per llama_decode call;
         `greedy_logits` holds the logits each greedy token was picked from.
     Self-consistency of the reference (stored in the metadata):
       * a separate 65-token evaluation vs rows 0..64 of the 200-token one;
       * the one-token-at-a-time decode logits vs one batched evaluation of prompt[:65] + greedy[:31].
Output (safetensors, numpy): prompt I32 [200], logits F32 [200, vocab], greedy_prompt_len I32 [1],
greedy I32 [32], greedy_logits F32 [32, vocab]; metadata: reference, preset, command, tolerance notes.

With MXFP4 experts (preset k3-tiny) llama.cpp's CPU MXFP4 dot products quantize the activations to Q8_0,
so those goldens only support a looser tolerance (and top-k routing may flip at a few positions); the
BF16-expert preset (k3-tiny-bf16) gives tight fp32 parity.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

REFERENCE = "llama.cpp (llama-cpp-python 0.3.36 vendored) kimi-k3, f32 GGUF, f32 KV"
GGML_TYPE_F32 = 0

# Runs in a fresh interpreter: the converter puts its own gguf-py on sys.path and configures logging.
CONVERT_SNIPPET = r"""
import sys
src, model_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, src)
import convert_hf_to_gguf as conv
from conversion import kimi_k3
# tokenizer-less test checkpoint: dummy vocabulary (vocab size still comes from the config)
kimi_k3.KimiK3Model.set_vocab = lambda self: self._set_vocab_none()
sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", out, model_dir]
conv.main()
"""


def run(cmd, **kw):
    print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def load_llama(llama_cpp, gguf_path, args):
    return llama_cpp.Llama(model_path=gguf_path, logits_all=True, n_ctx=512, n_batch=512, n_ubatch=512,
                           type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, n_threads=args.threads,
                           n_threads_batch=args.threads, n_gpu_layers=0, seed=args.seed, flash_attn=False,
                           verbose=args.verbose)


def eval_all(llama_cpp, gguf_path, ids, args):
    llm = load_llama(llama_cpp, gguf_path, args)
    llm.eval([int(t) for t in ids])
    out = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
    llm.close()
    return out


def greedy_decode(llama_cpp, gguf_path, prompt, n_new, args):
    llm = load_llama(llama_cpp, gguf_path, args)
    llm.eval([int(t) for t in prompt])
    prefill = np.array(llm.scores[: len(prompt)], dtype=np.float32, copy=True)
    toks, step_logits = [], []
    for i in range(n_new):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
        tok = int(np.argmax(row))  # first maximum = lowest id on ties
        toks.append(tok)
        step_logits.append(row)
        if i + 1 < n_new:
            llm.eval([tok])
    llm.close()
    return prefill, np.array(toks, dtype=np.int32), np.stack(step_logits)


def nmse(a, b):
    return float(np.sum((a.astype(np.float64) - b) ** 2) / max(np.sum(b.astype(np.float64) ** 2), 1e-300))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", required=True, help="kestrel binary (for make-model)")
    ap.add_argument("--llama-cpp-src", required=True, help="vendored llama.cpp tree (convert_hf_to_gguf.py)")
    ap.add_argument("--preset", default="k3-tiny-bf16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-tokens", type=int, default=200)
    ap.add_argument("--greedy-prompt-len", type=int, default=65)
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="prompt RandomState seed and llama.cpp seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-tmp", action="store_true", help="keep the checkpoint and GGUF (path printed)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    import llama_cpp  # the reference build (llama-cpp-python)
    from safetensors.numpy import save_file

    tmp = tempfile.mkdtemp(prefix="k3gold_")
    model_dir = os.path.join(tmp, "model")
    gguf_path = os.path.join(tmp, "model-f32.gguf")
    make_cmd = [args.kestrel, "make-model", "--preset", args.preset, "--out", model_dir]
    run(make_cmd)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg.get("text_config", cfg)
    vocab = int(tc["vocab_size"])
    n_mla, n_kda = tc["num_attention_heads"], tc["linear_attn_config"]["num_heads"]
    if n_mla != n_kda:
        sys.exit(f"llama.cpp's converter slices A_log by num_attention_heads: KDA num_heads ({n_kda}) must "
                 f"equal num_attention_heads ({n_mla}) for this preset")
    mxfp4 = (cfg.get("quantization_config") or tc.get("quantization_config") or {}).get("format") \
        == "mxfp4-pack-quantized"

    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # use the vendored gguf-py that matches the converter
    run([sys.executable, "-c", CONVERT_SNIPPET, args.llama_cpp_src, model_dir, gguf_path],
        env=env, stdout=subprocess.DEVNULL if not args.verbose else None)

    prompt = np.random.RandomState(args.seed).randint(0, vocab, args.n_tokens).astype(np.int32)
    L = args.greedy_prompt_len
    assert 0 < L <= args.n_tokens

    logits = eval_all(llama_cpp, gguf_path, prompt, args)
    assert logits.shape == (args.n_tokens, vocab), logits.shape
    assert np.all(np.isfinite(logits))

    prefill, greedy, greedy_logits = greedy_decode(llama_cpp, gguf_path, prompt[:L], args.greedy_tokens, args)
    d_prefix = float(np.max(np.abs(prefill - logits[:L])))
    # decode path (1 token / call) vs one batched pass over prompt[:L] + greedy[:-1]
    batched = eval_all(llama_cpp, gguf_path, np.concatenate([prompt[:L], greedy[:-1]]), args)[L - 1:]
    d_decode = float(np.max(np.abs(batched - greedy_logits)))
    argmax_ok = bool(np.array_equal(np.argmax(batched, axis=1), greedy))
    scale = float(np.max(np.abs(logits)))
    print(f"[{args.preset}] vocab {vocab}, max|logit| {scale:.4g}", file=sys.stderr)
    print(f"[{args.preset}] self-consistency: {L}-token run vs rows 0..{L-1} of the {args.n_tokens}-token run: "
          f"max abs diff {d_prefix:.3e}, nmse {nmse(prefill, logits[:L]):.3e}", file=sys.stderr)
    print(f"[{args.preset}] self-consistency: decode (1 token/call) vs batched: max abs diff {d_decode:.3e}, "
          f"nmse {nmse(greedy_logits, batched):.3e}, greedy == batched argmax: {argmax_ok}", file=sys.stderr)
    print(f"[{args.preset}] greedy: {','.join(map(str, greedy))}", file=sys.stderr)

    if mxfp4:
        tol = ("MXFP4 experts: llama.cpp's CPU MXFP4 dot products quantize the expert activations to Q8_0, so "
               "these logits differ from an exact-activation engine by NMSE ~1e-3..1e-2 and top-k routing may "
               "flip at some positions; compare with a loose tolerance (greedy tokens may diverge)")
    else:
        tol = "BF16 experts, all f32 in llama.cpp: expect tight fp32 parity (NMSE ~1e-7 or better)"
    command = " ".join(shlex.quote(a) for a in ["python", "tools/gen_k3_goldens.py"] + sys.argv[1:])
    meta = {
        "reference": REFERENCE,
        "preset": args.preset,
        "command": command,
        "make_model": " ".join(["kestrel", "make-model", "--preset", args.preset]),
        "prompt": f"numpy RandomState({args.seed}).randint(0, {vocab}, {args.n_tokens})",
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "experts": "mxfp4" if mxfp4 else "bf16",
        "tolerance_note": tol,
        "greedy": f"argmax over llama.cpp logits after prompt[:{L}], one token per llama_decode, no eos stop",
        "self_consistency_prefix_max_abs": f"{d_prefix:.3e}",
        "self_consistency_decode_vs_batched_max_abs": f"{d_decode:.3e}",
        "max_abs_logit": f"{scale:.4g}",
    }
    tensors = {
        "prompt": prompt,
        "logits": logits,
        "greedy_prompt_len": np.array([L], dtype=np.int32),
        "greedy": greedy,
        "greedy_logits": greedy_logits.astype(np.float32),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)
    if args.keep_tmp:
        print(f"kept {tmp}", file=sys.stderr)
    else:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
