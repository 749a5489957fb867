#!/usr/bin/env python3
"""gpt-oss test files and golden logits from two INDEPENDENT references: transformers `GptOssForCausalLM` and
llama.cpp (its converter, quantizer and runtime).

Run (from the repository root, with the project venv; llama-cpp-python set up as tools/gen_gguf_goldens.py says):

    python tools/gen_gptoss_goldens.py --llama-cpp-src <sdist>/vendor/llama.cpp

Steps
  1. A random gpt-oss checkpoint built in transformers (`GptOssForCausalLM(GptOssConfig(...))`, micro widths:
     8 query / 2 key-value heads of 16, 3 layers sliding / full / sliding with a 16-token window, 8 experts top-2
     of width 64, vocabulary 1024), every weight drawn from a seeded normal and rounded to bf16 (so a BF16 GGUF holds
     exactly the checkpoint's values), saved as float32 safetensors. The expert gate/up weights are scaled so that
     the clamp of the SwiGLU (limit 7) is hit; the sinks are drawn around the scores. YaRN as gpt-oss's config
     (factor 32 over 4096 positions, beta 32 / 1, theta 150000) but with "truncate": true, the rounding llama.cpp
     always applies, so that both references compute the same model.
  2. transformers, float32, eager attention: logits of every position of a fixed 200-token prompt
     (numpy RandomState(0).randint(0, 1024, 200)) in one forward, and a 32-token greedy continuation of its first
     65 tokens through the KV cache (checked against a teacher-forced forward)  → tests/data/models/gptoss_micro.safetensors.
     Also transformers' own YaRN tables for the released gpt-oss-20b rope (head_dim 64), with truncate false
     (the released config) and true: inv_freq and the attention factor.
  3. llama.cpp's convert_hf_to_gguf.py --outtype bf16 (tools/gen_gguf_goldens.py's CONVERT_SNIPPET: set_vocab
     patched to none + vocab_size, the checkpoint has no tokenizer)  → tests/data/gguf/gptoss_micro_bf16.gguf; the float32 conversion quantized by
     llama_model_quantize MOSTLY_MXFP4_MOE (experts MXFP4, other matrices Q8_0)  → gptoss_micro_mxfp4.gguf.
     For each file, llama.cpp's logits on the 64-token prompt of tools/gen_gguf_goldens.py and on the file decoded
     to F32 (logits_exact)  → <file>.logits.safetensors. The checkpoint's config.json is kept next to them
     (gptoss_micro.config.json) so a test can compare the GGUF metadata with it.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_command import recorded_command  # noqa: E402
import gen_gguf_goldens as gg  # noqa: E402
from golden_hf import golden_tensors, prompt_and_greedy  # noqa: E402

LLAMA_FTYPE_MOSTLY_MXFP4_MOE = 38



def micro_config():
    from transformers import GptOssConfig
    return GptOssConfig(vocab_size=1024, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                        num_experts_per_tok=2, sliding_window=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                                         "original_max_position_embeddings": 4096},
                        attention_bias=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def randomize(model, torch):
    """Seeded normal weights, rounded to bf16 (kept float32)."""
    g = torch.Generator().manual_seed(0)

    def normal(shape, std, mean=0.0):
        return (torch.randn(shape, generator=g) * std + mean).to(torch.bfloat16).float()

    for name, p in sorted(model.named_parameters()):
        s = tuple(p.shape)
        if name.endswith("norm.weight"):
            v = normal(s, 0.1, 1.0)
        elif name.endswith("sinks"):
            v = normal(s, 1.5)
        elif name.endswith("embed_tokens.weight"):
            v = normal(s, 1.0)
        elif name.endswith("gate_up_proj"):  # [E, hidden, 2I]: scores large enough that the clamp at 7 bites
            v = normal(s, 3.0 / s[1] ** 0.5)
        elif name.endswith("down_proj") and "experts" in name:  # [E, I, hidden]
            v = normal(s, 0.5 / s[1] ** 0.5)
        elif name.endswith("bias"):
            v = normal(s, 0.3)
        elif name.endswith("router.weight"):
            v = normal(s, 2.0 / s[1] ** 0.5)
        elif p.dim() == 2:  # nn.Linear [out, in]
            v = normal(s, 1.0 / s[1] ** 0.5)
        else:
            raise SystemExit(f"no init rule for {name} {s}")
        with torch.no_grad():
            p.copy_(v)


def rope_tables(torch):
    """transformers' YaRN tables for gpt-oss-20b's rope (head_dim 64), truncate false and true."""
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    out = {}
    for truncate in (False, True):
        cfg = GptOssConfig()
        cfg.rope_parameters = dict(cfg.rope_parameters, truncate=truncate)
        inv, att = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        out[f"yarn_inv_freq_truncate_{str(truncate).lower()}"] = inv.float().numpy().astype(np.float32)
        out[f"yarn_attention_factor_truncate_{str(truncate).lower()}"] = np.array([att], dtype=np.float32)
    return out


def clamp_fraction(model, torch):
    """Share of expert gate pre-activations above the SwiGLU limit on the golden prompt (the clamp is exercised)."""
    hits = []

    def hook(mod, inp, _out):
        x = inp[0]
        gate = (x @ mod.gate_up_proj[0] + mod.gate_up_proj_bias[0])[..., ::2]
        hits.append(float((gate > mod.limit).float().mean()))
    hs = [layer.mlp.experts.register_forward_hook(hook) for layer in model.model.layers]
    ids = torch.from_numpy(np.random.RandomState(0).randint(0, model.config.vocab_size, size=64))[None]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in hs:
        h.remove()
    return float(np.mean(hits))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp-src", required=True)
    ap.add_argument("--models-out", default="tests/data/models/gptoss_micro.safetensors")
    ap.add_argument("--gguf-dir", default="tests/data/gguf")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    command = recorded_command("gen_gptoss_goldens.py")

    import torch
    import transformers
    from safetensors.numpy import save_file
    from transformers import GptOssForCausalLM

    sys.path.insert(0, os.path.join(args.llama_cpp_src, "gguf-py"))
    import gguf as gguf_mod
    import llama_cpp

    torch.manual_seed(0)
    cfg = micro_config()
    model = GptOssForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize(model, torch)
    model.eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; layer types {cfg.layer_types}")
    clamp = clamp_fraction(model, torch)
    print(f"gate pre-activations above the limit (expert 0, 64 tokens): {clamp:.3f}")
    assert clamp > 0.01

    tmp = tempfile.mkdtemp(prefix="gptossgold_")
    ckpt = os.path.join(tmp, "ckpt")
    model.save_pretrained(ckpt, safe_serialization=True)
    # Reload from disk (the checkpoint the converter reads) and check it is the same model.
    model2 = GptOssForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    model2.eval()
    prompt, logits, greedy, consistency = prompt_and_greedy(model2, torch)

    meta = {"reference": f"transformers {transformers.__version__} GptOssForCausalLM float32 eager",
            "torch": torch.__version__, "command": command, "gate_above_limit_fraction": f"{clamp:.4f}",
            "model": "tests/data/gguf/gptoss_micro_bf16.gguf (the same weights; gptoss_micro.config.json)"}
    meta.update(consistency)
    tensors = golden_tensors(prompt, logits, greedy)
    tensors.update(rope_tables(torch))
    save_file(tensors, args.models_out, metadata=meta)
    print(f"wrote {args.models_out} ({os.path.getsize(args.models_out)} bytes)")
    shutil.copy(os.path.join(ckpt, "config.json"), os.path.join(args.gguf_dir, "gptoss_micro.config.json"))

    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)

    def convert(outtype, path):
        gg.run([sys.executable, "-c", gg.CONVERT_SNIPPET, args.llama_cpp_src, ckpt, path, outtype], env=env,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    bf16 = os.path.join(args.gguf_dir, "gptoss_micro_bf16.gguf")
    convert("bf16", bf16)
    f32 = os.path.join(tmp, "gptoss-f32.gguf")
    convert("f32", f32)
    mx = os.path.join(args.gguf_dir, "gptoss_micro_mxfp4.gguf")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    p.nthread = 2
    if llama_cpp.llama_model_quantize(f32.encode(), mx.encode(), p) != 0:
        sys.exit("llama_model_quantize MOSTLY_MXFP4_MOE failed")

    for name, path, made_by in (("gptoss_micro_bf16", bf16, "convert_hf_to_gguf.py --outtype bf16"),
                                ("gptoss_micro_mxfp4", mx, "convert --outtype f32, then llama_model_quantize "
                                                           "MOSTLY_MXFP4_MOE (experts MXFP4, other matrices Q8_0)")):
        vocab = cfg.vocab_size
        ids = np.random.RandomState(0).randint(0, vocab, gg.N_PROMPT).astype(np.int32)
        exact_path = os.path.join(tmp, name + "-exact-f32.gguf")
        gg.dequantize_gguf(gguf_mod, path, exact_path)
        native = gg.llama_logits(llama_cpp, path, ids, args.threads)
        exact = gg.llama_logits(llama_cpp, exact_path, ids, args.threads)
        assert np.all(np.isfinite(native)) and np.all(np.isfinite(exact))
        r = gg.nmse_rows(native, exact)
        types = gg.tensor_types(gguf_mod, path)
        # The exact decode of the BF16 file is the transformers model: both references must agree there.
        if name == "gptoss_micro_bf16":
            d = np.abs(exact - logits.numpy()[: gg.N_PROMPT]).max()
            print(f"[{name}] llama.cpp exact decode vs transformers: max|dlogit| {d:.3e}")
            assert d < 1e-3, "llama.cpp and transformers disagree on the same gpt-oss weights"
        m = {"reference": "llama.cpp (llama-cpp-python 0.3.36 vendored), f32 KV, CPU", "gguf": name + ".gguf",
             "made_by": made_by, "tensor_types": ",".join(types),
             "prompt": f"numpy RandomState(0).randint(0, {vocab}, {gg.N_PROMPT})",
             "logits_exact": "llama.cpp on this GGUF with every tensor decoded to F32 by gguf-py (f32 activations)",
             "native_vs_exact_nmse_median": f"{np.median(r):.3e}", "native_vs_exact_nmse_max": f"{np.max(r):.3e}",
             "native_vs_exact_rows_nmse_over_1e-2": f"{int(np.sum(r > 1e-2))}/{len(r)}",
             "native_vs_exact_argmax_mismatch_rows": f"{int(np.sum(native.argmax(1) != exact.argmax(1)))}/{len(r)}",
             "command": command}
        save_file({"prompt": ids, "logits": native, "logits_exact": exact},
                  os.path.join(args.gguf_dir, name + ".logits.safetensors"), metadata=m)
        print(f"[{name}] {os.path.getsize(path)} bytes, types {types}; native vs exact decode: NMSE median "
              f"{np.median(r):.3e} max {np.max(r):.3e}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
