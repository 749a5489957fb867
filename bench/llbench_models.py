"""Checkpoints and GGUF files for bench/llama_cpp_compare.py, and what the GGUF header says about them.

Every file is made by an independent tool: `kestrel make-model` writes the HF checkpoint, llama.cpp's own
converter (the vendored convert_hf_to_gguf.py, driven as tools/gen_gguf_goldens.py drives it) writes the
GGUF, llama.cpp's llama_model_quantize writes the Q4_0 and MXFP4_MOE files. Kestrel only reads them.
"""
import hashlib
import os
import shlex
import subprocess
import sys

import numpy as np

LLAMA_FTYPE_MOSTLY_Q4_0 = 2
LLAMA_FTYPE_MOSTLY_MXFP4_MOE = 38
GGML_TYPE_Q4_0 = 2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from gen_gguf_goldens import CONVERT_SNIPPET  # noqa: E402  (dummy vocabulary for tokenizer-less checkpoints)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("+ " + " ".join(shlex.quote(str(c)) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


def sha256(path, chunk=1 << 24):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def make_checkpoint(kestrel, preset, out_dir):
    if not os.path.exists(os.path.join(out_dir, "model.safetensors.index.json")):
        run([kestrel, "make-model", "--preset", preset, "--out", out_dir])
    return out_dir


def convert(python, llama_cpp_src, model_dir, out, outtype):
    """llama.cpp's converter: F32 norms/routers stay F32, K3 MXFP4 experts are repacked (not requantized)."""
    if not os.path.exists(out):
        tmp = out + ".part"
        run([python, "-c", CONVERT_SNIPPET, llama_cpp_src, model_dir, tmp, outtype])
        os.replace(tmp, out)
    return out


def quantize_q4_0(src, dst, threads=2):
    """llama_model_quantize MOSTLY_Q4_0 with output and token embedding forced to Q4_0 too (the default would
    make the output Q6_K, which Kestrel does not read); tensors llama.cpp keeps F32 (norms, router biases,
    conv, A/dt) stay F32. allow_requantize: the K3 MXFP4 experts become Q4_0 as well."""
    if os.path.exists(dst):
        return dst
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = LLAMA_FTYPE_MOSTLY_Q4_0
    p.output_tensor_type = GGML_TYPE_Q4_0
    p.token_embedding_type = GGML_TYPE_Q4_0
    p.allow_requantize = True
    p.nthread = threads
    tmp = dst + ".part"
    log(f"+ llama_model_quantize {src} -> {dst} (Q4_0)")
    if llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), p) != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src}")
    os.replace(tmp, dst)
    return dst


def quantize_mxfp4_moe(src, dst, threads=2):
    """llama_model_quantize MOSTLY_MXFP4_MOE: the 3-D expert tensors MXFP4, the other matrices Q8_0 (what
    llama.cpp's quantizer does for that type), tensors it keeps F32 (norms, biases, sinks, router) stay F32."""
    if os.path.exists(dst):
        return dst
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    p.nthread = threads
    tmp = dst + ".part"
    log(f"+ llama_model_quantize {src} -> {dst} (MXFP4_MOE)")
    if llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), p) != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src}")
    os.replace(tmp, dst)
    return dst


def quantize_q4_0_binary(llama_quantize, src, dst, threads=2):
    """The same quantization as quantize_q4_0, by llama.cpp's llama-quantize program (built from the same source
    package) instead of the Python binding."""
    if not os.path.exists(dst):
        tmp = dst + ".part"
        run([llama_quantize, "--allow-requantize", "--output-tensor-type", "q4_0", "--token-embedding-type", "q4_0",
             src, tmp, "Q4_0", str(threads)], stdout=subprocess.DEVNULL)
        os.replace(tmp, dst)
    return dst


def with_tokenizer(llama_cpp_src, src, dst, tiktoken_path, n_ranks=4096):
    """A copy of `src` (a GGUF converted with the dummy vocabulary) whose tokenizer is the first n_ranks ranks of
    a tiktoken file plus a few specials, built as llama.cpp's converter builds Kimi's (tools/gen_gguf_goldens.py
    write_tokenizer_gguf), padded to the model's vocabulary: both servers then load it and tokenize alike. The
    tensors are copied byte for byte."""
    if os.path.exists(dst):
        return dst
    sys.path.insert(0, os.path.join(llama_cpp_src, "gguf-py"))
    import gguf
    from gen_gguf_goldens import TOKENIZER_SPECIALS, read_tiktoken
    sys.path.insert(0, llama_cpp_src)
    from conversion.qwen import QwenModel
    ranks = read_tiktoken(tiktoken_path, n_ranks)
    specials = {t: n_ranks + i for i, t in enumerate(TOKENIZER_SPECIALS)}
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    vocab_size = int(r.fields[f"{arch}.vocab_size"].contents())
    merges, vocab = [], {}
    for token, rank in ranks.items():
        vocab[QwenModel.token_bytes_to_string(token)] = rank
        if len(token) > 1:
            merged = QwenModel.bpe(ranks, token, max_rank=rank)
            if len(merged) == 2:
                merges.append(" ".join(map(QwenModel.token_bytes_to_string, merged)))
    reverse = {i: t for t, i in {**vocab, **specials}.items()}
    T = gguf.TokenType
    tokens = [reverse.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [T.UNUSED if i not in reverse else T.CONTROL if i in specials.values() else T.NORMAL
             for i in range(vocab_size)]
    tmp = dst + ".part"
    w = gguf.GGUFWriter(tmp, arch)
    for k, f in r.fields.items():
        if k.startswith(("GGUF.", "tokenizer.")) or k == "general.architecture":
            continue
        w.add_key_value(k, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["[BOS]"])
    w.add_eos_token_id(specials["[EOS]"])
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()
    os.replace(tmp, dst)
    log(f"wrote {dst} ({vocab_size} tokens: {n_ranks} ranks of {os.path.basename(tiktoken_path)}, "
        f"{len(specials)} specials, padding)")
    return dst


def _field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def header_facts(gguf_mod, path):
    """Per-token weight traffic from the GGUF header (tensor sizes and the expert count / top-k keys).

    active bytes per decoded token = every tensor's bytes, except
      token_embd: one row (a lookup),
      routed experts (`*_exps`, [n_expert, ...]): top-k of n_expert,
    and active params likewise (for prefill GOP/s: 2 ops per active matrix parameter per token, the lm_head
    included, the embedding lookup not). Norm/bias vectors are counted in bytes (they are read) but they are
    negligible. KDA state / KV cache traffic is not in these numbers (constant per token at empty context:
    a few MB, see the table notes)."""
    r = gguf_mod.GGUFReader(path)
    arch = _field(r, "general.architecture")
    n_expert = int(_field(r, f"{arch}.expert_count", 0) or 0)
    top_k = int(_field(r, f"{arch}.expert_used_count", 0) or 0)
    total = active = 0.0
    active_params = 0.0
    types = {}
    for t in r.tensors:
        nb = float(t.n_bytes)
        ne = float(np.prod([int(d) for d in t.shape]))
        total += nb
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + int(t.n_bytes)
        if t.name == "token_embd.weight":
            rows = int(t.shape[-1])
            active += nb / rows
            continue
        frac = 1.0
        if "_exps" in t.name and n_expert > 0:
            frac = top_k / n_expert
        active += nb * frac
        if len(t.shape) >= 2 and int(t.shape[0]) > 1 and int(t.shape[1]) > 1:
            active_params += ne * frac
    vocab = int(_field(r, f"{arch}.vocab_size", 0) or 0)
    if not vocab:  # the deepseek2 converter writes no vocab_size: the embedding's rows
        vocab = next(int(t.shape[-1]) for t in r.tensors if t.name == "token_embd.weight")
    return {"arch": arch, "n_expert": n_expert, "top_k": top_k, "file_bytes": os.path.getsize(path),
            "tensor_bytes": total, "active_bytes_per_token": active, "active_params_per_token": active_params,
            "bytes_by_type": types, "vocab": vocab}
