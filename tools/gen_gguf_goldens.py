#!/usr/bin/env python3
"""GGUF test files and golden logits from an INDEPENDENT reference: llama.cpp's converter and runtime.

Reference: the llama.cpp vendored in llama-cpp-python 0.3.36 (convert_hf_to_gguf.py + conversion/kimi_k3.py,
conversion/kimi_linear.py, conversion/deepseek.py, conversion/qwen.py; src/models/kimi-k3.cpp, kimi-linear.cpp,
deepseek2.cpp, qwen3moe.cpp; gguf-py). Installation as described in tools/gen_k3_goldens.py (or the sdist's llama_cpp package on PYTHONPATH
with LLAMA_CPP_LIB_PATH naming a directory of libllama.so / libggml*.so built from the same sdist; the package
imports numpy, diskcache and jinja2). The deepseek2 cases: `--only deepseek_v3_micro_bf16,deepseek_v3_micro_f16,
deepseek_v3_micro_q8_0,deepseek_v3_micro_q4_0` (DeepSeek V3 structure) and `--only deepseek_v2_lite_micro_bf16,
deepseek_v2_lite_micro_q8_0,deepseek_v2_lite_micro_q4_0` (DeepSeek-V2-Lite structure). The qwen3moe cases:
`--only qwen3moe_micro_bf16,qwen3moe_micro_q8_0,qwen3moe_micro_q4_0` (Qwen3-MoE structure).

Run (from the repository root, with the project venv):

    python tools/gen_gguf_goldens.py --kestrel build/release/kestrel \\
        --llama-cpp-src <sdist>/vendor/llama.cpp --out-dir tests/data/gguf

For each case below:
  1. `kestrel make-model --preset P`: random checkpoint in the released HF layout (micro presets, ~1M
     parameters, so the committed GGUFs stay small).
  2. llama.cpp's convert_hf_to_gguf.py --outtype T (subprocess; set_vocab monkeypatched to
     `_set_vocab_none` because the test checkpoints ship no tokenizer), or, for Q4_0,
     llama_cpp.llama_model_quantize (MOSTLY_Q4_0, output and token-embedding tensors forced to Q4_0 too) on
     the f32 conversion.
  3. llama_cpp.Llama on the very same GGUF: f32 KV cache, logits of every position of a fixed 64-token
     prompt (numpy RandomState(0).randint(0, vocab, 64)), one ubatch, CPU  → `logits`.
  4. The same GGUF with every tensor decoded to F32 by gguf-py's own gguf.quants.dequantize (metadata copied
     unchanged) and run through llama.cpp the same way → `logits_exact`.
Writes <case>.gguf and <case>.logits.safetensors (prompt I32 [64], logits F32 [64, vocab], logits_exact F32
[64, vocab]; metadata: reference, command, the weight types present, how far `logits` is from
`logits_exact`). llama.cpp computes BF16/Q8_0/Q4_0/MXFP4 matmuls with the activations rounded to BF16 (bf16
weights) or quantized to Q8_0 (Q8_0/Q4_0/MXFP4 weights), so `logits` differs from an fp32-activation engine
on the same weights, and with top-k routing that noise flips expert choices at some tokens; `logits_exact`
has none of that (f32 weights holding exactly the decoded values, f32 activations), so an engine that decodes
the file exactly must match it to fp32 rounding. tests/models/gguf_test.cpp states the bounds.

Tokenizer golden (tests/data/gguf/tokenizer_cl100k4k.gguf + .json): a GGUF holding only metadata and a
tokenizer built exactly as conversion/kimi_linear.py's set_vocab builds Kimi's (GPT-2 byte-level token
strings via QwenModel.token_bytes_to_string, merges via QwenModel.bpe, CONTROL specials, UNUSED padding,
pre-tokenizer "kimi-k2") from the first 4096 ranks of the public cl100k_base vocabulary
(tools/extract_vocabs.py writes it; --tiktoken-dir) plus six Kimi special tokens; the ids llama.cpp's tokenizer
(llama_cpp.Llama(vocab_only=True).tokenize, special=False and special=True) gives for a fixed list of texts.

Also writes the fuzz_gguf seed corpus (tests/fuzz/corpus/gguf: a tiny file with every value type and
F32/Q8_0/Q4_0/MXFP4 tensors, and the k3_micro_q4_0 metadata with no tensors) and
tests/data/ops/gguf_blocks.safetensors: random Q8_0 / Q4_0 / MXFP4 blocks (raw bytes, U8) and
their values as decoded by gguf-py's own gguf.quants.dequantize (F32), for the kernel decode test.
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_command import recorded_command  # noqa: E402

GGML_TYPE_F32 = 0
GGML_TYPE_Q4_0 = 2
LLAMA_FTYPE_MOSTLY_Q4_0 = 2
N_PROMPT = 64

CONVERT_SNIPPET = r"""
import sys
src, model_dir, out, outtype = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, src)
import convert_hf_to_gguf as conv
from conversion import deepseek, gpt_oss, kimi_k3, kimi_linear, qwen
# tokenizer-less test checkpoints: dummy vocabulary (vocab size still comes from the config)
kimi_k3.KimiK3Model.set_vocab = lambda self: self._set_vocab_none()
kimi_linear.KimiLinearModel.set_vocab = lambda self: self._set_vocab_none()
deepseek.DeepseekV2Model.set_vocab = lambda self: self._set_vocab_none()
# (conversion/qwen.py and gpt_oss.py write no <arch>.vocab_size, which llama.cpp needs without a vocabulary: added here)
qwen.Qwen3MoeModel.set_vocab = lambda self: (self._set_vocab_none(), self.gguf_writer.add_vocab_size(self.hparams["vocab_size"]))
gpt_oss.GptOssModel.set_vocab = lambda self: (self._set_vocab_none(), self.gguf_writer.add_vocab_size(self.hparams["vocab_size"]))
sys.argv = ["convert_hf_to_gguf.py", "--outtype", outtype, "--outfile", out, model_dir]
conv.main()
"""

# name, make-model preset, how: ("convert", outtype) or ("quantize_q4_0", None)
CASES = [
    ("k3_micro_f16", "k3-micro-bf16", "convert", "f16"),
    ("k3_micro_q8_0", "k3-micro-bf16", "convert", "q8_0"),
    ("k3_micro_q4_0", "k3-micro-bf16", "quantize_q4_0", None),
    ("k3_micro_mxfp4", "k3-micro", "convert", "bf16"),  # experts stay MXFP4 (repacked), the rest BF16
    ("kimi_linear_micro_bf16", "kimi-linear-micro", "convert", "bf16"),
    # deepseek2 (DeepseekV3ForCausalLM → conversion/deepseek.py DeepseekV2Model: kv_b split into k_b/v_b)
    ("deepseek_v3_micro_bf16", "deepseek-v3-micro-bf16", "convert", "bf16"),
    ("deepseek_v3_micro_f16", "deepseek-v3-micro-bf16", "convert", "f16"),
    ("deepseek_v3_micro_q8_0", "deepseek-v3-micro-bf16", "convert", "q8_0"),
    ("deepseek_v3_micro_q4_0", "deepseek-v3-micro-bf16", "quantize_q4_0", None),
    # deepseek2 as DeepSeek-V2-Lite: no q_lora (attn_q), softmax greedy routing without exp_probs_b, 27 layers
    ("deepseek_v2_lite_micro_bf16", "deepseek-v2-lite-micro-bf16", "convert", "bf16"),
    ("deepseek_v2_lite_micro_q8_0", "deepseek-v2-lite-micro-bf16", "convert", "q8_0"),
    ("deepseek_v2_lite_micro_q4_0", "deepseek-v2-lite-micro-bf16", "quantize_q4_0", None),
    # qwen3moe (Qwen3MoeForCausalLM → conversion/qwen.py Qwen3MoeModel): GQA, q/k norms, experts stacked
    ("qwen3moe_micro_bf16", "qwen3moe-micro-bf16", "convert", "bf16"),
    ("qwen3moe_micro_q8_0", "qwen3moe-micro-bf16", "convert", "q8_0"),
    ("qwen3moe_micro_q4_0", "qwen3moe-micro-bf16", "quantize_q4_0", None),
]

# llama.cpp 0.3.36 runs deepseek2 files with quantized or F16 weights only without its CPU weight repacking
# (extra buffer types): with it, these files stop at GGML_ASSERT(*cur_backend_id != -1) in ggml-backend.cpp
# (attn_k_b / attn_v_b quantized or F16), or crash in llama_decode (the halves F32, the rest Q8_0 / Q4_0).
# Repacking changes the weight layout and kernels, not the number formats (the same Q8_0 activations), so
# these goldens are made with it off.
NO_REPACK_PREFIX = "deepseek"


def run(cmd, **kw):
    print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def llama_logits(llama_cpp, path, ids, threads, repack=True):
    if not repack:  # llama_model_params.use_extra_bufts = false (what llama-bench --no-repack sets)
        default = llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p
        llama_cpp.llama_model_default_params = params
        llama_cpp.llama.llama_cpp.llama_model_default_params = params
    try:
        return _llama_logits(llama_cpp, path, ids, threads)
    finally:
        if not repack:
            llama_cpp.llama_model_default_params = default
            llama_cpp.llama.llama_cpp.llama_model_default_params = default


def _llama_logits(llama_cpp, path, ids, threads):
    llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=256, n_batch=256, n_ubatch=256,
                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, n_threads=threads, n_threads_batch=threads,
                          n_gpu_layers=0, seed=0, flash_attn=False, verbose=False)
    llm.eval([int(t) for t in ids])
    out = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
    llm.close()
    return out


def quantize_q4_0(llama_cpp, src, dst):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = LLAMA_FTYPE_MOSTLY_Q4_0
    p.output_tensor_type = GGML_TYPE_Q4_0
    p.token_embedding_type = GGML_TYPE_Q4_0
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p)
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")


def dequantize_gguf(gguf_mod, src, dst):
    """Copy of a GGUF with every tensor decoded to F32 by gguf-py (gguf.quants.dequantize); KVs copied."""
    r = gguf_mod.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf_mod.GGUFWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(k, f.contents(), vt, f.types[-1] if vt == gguf_mod.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        data = gguf_mod.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def nmse_rows(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum((a - b) ** 2, axis=-1) / np.sum(b ** 2, axis=-1)


def tensor_types(gguf_mod, path):
    r = gguf_mod.GGUFReader(path)
    return sorted({t.tensor_type.name for t in r.tensors})


def block_goldens(gguf_mod, out_path):
    """Random blocks decoded by gguf-py's reference dequantizer (gguf/quants.py)."""
    from safetensors.numpy import save_file
    rng = np.random.RandomState(7)
    Q = gguf_mod.GGMLQuantizationType
    tensors = {}
    for name, qt, n_blocks in (("q8_0", Q.Q8_0, 64), ("q4_0", Q.Q4_0, 64), ("mxfp4", Q.MXFP4, 64)):
        block, size = gguf_mod.GGML_QUANT_SIZES[qt]
        raw = rng.randint(0, 256, size=(n_blocks, size)).astype(np.uint8)
        if qt in (Q.Q8_0, Q.Q4_0):  # finite fp16 scales in a sane range (random bytes can be inf/nan)
            d = (rng.uniform(-2, 2, n_blocks) * 10.0 ** rng.uniform(-4, 1, n_blocks)).astype(np.float16)
            raw[:, :2] = d.view(np.uint8).reshape(n_blocks, 2)
        else:  # E8M0 scales over the whole finite range, including the subnormal ones 0 and 1
            raw[:, 0] = rng.randint(0, 255, n_blocks).astype(np.uint8)
            raw[:4, 0] = [0, 1, 127, 254]
        vals = gguf_mod.quants.dequantize(raw.reshape(-1), qt).astype(np.float32)
        assert vals.size == n_blocks * block
        tensors[name + "_blocks"] = raw.reshape(-1)
        tensors[name + "_values"] = vals.reshape(-1)
    # Activations as llama.cpp's CPU backend quantizes them to Q8_0 on x86 (ggml-cpu/arch/x86/quants.c
    # quantize_row_q8_0, AVX path): per 32-block d = amax/127 stored as fp16, id = 127/amax (0 if amax = 0),
    # q = round-half-even(x·id), all in fp32. gguf-py's Q8_0 quantizer is ggml's generic reference
    # (id = 1/d, roundf); its codes are kept too, to show how often the two differ.
    x = (rng.standard_normal((3, 288)) * rng.uniform(0.01, 3, (3, 1))).astype(np.float32)
    x[0, 64:96] = 0  # an all-zero block: d = 0, q = 0
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(axis=1, keepdims=True).astype(np.float32)
    d16 = (amax / np.float32(127)).astype(np.float16)
    with np.errstate(divide="ignore"):
        idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((xb * idv).astype(np.float32)).astype(np.int8)
    tensors["q8acts_x"] = x.reshape(-1)
    tensors["q8acts_blocks"] = np.concatenate([d16.view(np.uint8), q.view(np.uint8)], axis=1).reshape(-1)
    ref = gguf_mod.quants.quantize(x, Q.Q8_0).reshape(-1, 34)
    tensors["q8acts_blocks_gguf_py"] = ref.reshape(-1)
    print(f"q8 activations: x86 path vs gguf-py reference: {int(np.sum(ref[:, 2:] != q.view(np.uint8)))} codes differ",
          file=sys.stderr)
    save_file(tensors, out_path, metadata={"reference": "gguf-py gguf.quants.dequantize (llama-cpp-python 0.3.36 "
                                                        "vendored); q8acts_*: numpy transcription of ggml-cpu x86 "
                                                        "quantize_row_q8_0 + gguf-py quantize",
                                           "command": "python tools/gen_gguf_goldens.py --only blocks"})
    print(f"wrote {out_path}", file=sys.stderr)


def fuzz_seeds(gguf_mod, meta_src, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    Q, V = gguf_mod.GGMLQuantizationType, gguf_mod.GGUFValueType
    w = gguf_mod.GGUFWriter(os.path.join(out_dir, "seed_types.gguf"), "kimi-k3")
    w.add_uint8("t.u8", 7), w.add_int8("t.i8", -7), w.add_uint16("t.u16", 700), w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000), w.add_int32("t.i32", -70000), w.add_float32("t.f32", 0.5)
    w.add_bool("t.bool", True), w.add_uint64("t.u64", 1 << 40), w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 0.25), w.add_string("t.str", "kestrel")
    w.add_array("t.arr_i32", [0, 1, 0]), w.add_array("t.arr_str", ["a", "bc"])
    rng = np.random.RandomState(1)
    w.add_tensor("f32", rng.randn(2, 4).astype(np.float32))
    for name, qt in (("q8_0", Q.Q8_0), ("q4_0", Q.Q4_0), ("mxfp4", Q.MXFP4)):
        block, size = gguf_mod.GGML_QUANT_SIZES[qt]
        w.add_tensor(name, rng.randint(0, 256, size=(2, size)).astype(np.uint8), raw_dtype=qt)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    r = gguf_mod.GGUFReader(meta_src)
    w = gguf_mod.GGUFWriter(os.path.join(out_dir, "seed_k3_metadata.gguf"), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if not (k.startswith("GGUF.") or k == "general.architecture"):
            w.add_key_value(k, f.contents(), f.types[0], f.types[-1] if f.types[0] == V.ARRAY else None)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    print(f"wrote fuzz seeds in {out_dir}", file=sys.stderr)


TOKENIZER_TEXTS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "I'm sure you'll see they've done it, isn't it?",
    "DON'T SHOUT, We'Re Here", "1234567890 3.14159 -42 1e10 2,000,000", "a   b\n\n\tc  \r\n  d", "    indented",
    "def f(x):\n    return x * 2  # comment\n", "caf\u00e9 na\u00efve \u00fcber fa\u00e7ade", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "emoji \U0001f642\U0001f44d\U0001f680 done",
    "!!!???...;;;", "<|im_end|>", "[BOS]hello<|im_user|>user<|im_middle|>hi<|im_end|>", "x" * 300,
    "mixedCASEWords andNumbers123abc ABC123def", "tab\tseparated\tvalues\n", "  leading and trailing  ",
    "https://example.com/path?query=1&x=y#frag", "\u00a0non-breaking\u2003spaces\u3000here", "",
    "The year 2024 had 366 days; 12 months.", "e = mc^2 and \u2211_{i=1}^{n} i = n(n+1)/2",
]
TOKENIZER_SPECIALS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>"]


def write_tokenizer_gguf(gguf_mod, llama_cpp_src, meta_src, ranks, specials, path, bos=None, eos=None):
    """A metadata-only GGUF (hparams copied from meta_src) with a tokenizer built exactly as
    conversion/kimi_linear.py KimiLinearModel.set_vocab builds Kimi's (tokpre == "kimi-k2").
    ranks: {token bytes: rank}; specials: {text: id} (ids after the ranks)."""
    sys.path.insert(0, llama_cpp_src)
    from conversion.qwen import QwenModel  # the converter's own helpers
    T = gguf_mod.TokenType
    merges, vocab = [], {}
    for token, rank in ranks.items():
        vocab[QwenModel.token_bytes_to_string(token)] = rank
        if len(token) == 1:
            continue
        merged = QwenModel.bpe(ranks, token, max_rank=rank)
        if len(merged) == 2:
            merges.append(" ".join(map(QwenModel.token_bytes_to_string, merged)))
    vocab_size = max(specials.values()) + 3  # two padding slots, as the release pads its table
    reverse = {i: t for t, i in {**vocab, **specials}.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(T.UNUSED)
        else:
            tokens.append(reverse[i])
            types.append(T.CONTROL if i in specials.values() else T.NORMAL)
    r = gguf_mod.GGUFReader(meta_src)
    arch = r.fields["general.architecture"].contents()
    w = gguf_mod.GGUFWriter(path, arch)
    for k, f in r.fields.items():
        if k.startswith(("GGUF.", "tokenizer.")) or k in ("general.architecture", f"{arch}.vocab_size"):
            continue
        w.add_key_value(k, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf_mod.GGUFValueType.ARRAY else None)
    w.add_vocab_size(vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def read_tiktoken(path, limit=None):
    import base64
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, r = line.split()
                if limit is None or int(r) < limit:
                    ranks[base64.b64decode(tok)] = int(r)
    return ranks


def tokenizer_golden(gguf_mod, llama_cpp, llama_cpp_src, meta_src, tiktoken_dir, out_dir, n_ranks=4096):
    import json
    ranks = read_tiktoken(os.path.join(tiktoken_dir, "cl100k_base.tiktoken"), n_ranks)
    specials = {s: n_ranks + i for i, s in enumerate(TOKENIZER_SPECIALS)}
    path = os.path.join(out_dir, "tokenizer_cl100k4k.gguf")
    write_tokenizer_gguf(gguf_mod, llama_cpp_src, meta_src, ranks, specials, path, specials["[BOS]"],
                         specials["<|im_end|>"])
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    cases = []
    for text in TOKENIZER_TEXTS:
        b = text.encode("utf-8")
        cases.append({"text": text, "ids_as_text": llm.tokenize(b, add_bos=False, special=False),
                      "ids_allow_special": llm.tokenize(b, add_bos=False, special=True)})
    llm.close()
    with open(os.path.join(out_dir, "tokenizer_cl100k4k.json"), "w") as f:
        json.dump({"reference": "llama.cpp tokenizer (llama-cpp-python 0.3.36), vocab_only, add_bos=False",
                   "gguf": "tokenizer_cl100k4k.gguf", "command": "python tools/gen_gguf_goldens.py --only tokenizer",
                   "cases": cases}, f, ensure_ascii=False, indent=0)
    print(f"wrote {path} ({os.path.getsize(path)} bytes) and its golden", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", required=True)
    ap.add_argument("--llama-cpp-src", required=True)
    ap.add_argument("--out-dir", default="tests/data/gguf")
    ap.add_argument("--blocks-out", default="tests/data/ops/gguf_blocks.safetensors")
    ap.add_argument("--fuzz-seeds", default="tests/fuzz/corpus/gguf")
    ap.add_argument("--tiktoken-dir", default="build/vocab", help="tools/extract_vocabs.py --out-dir")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    sys.path.insert(0, os.path.join(args.llama_cpp_src, "gguf-py"))
    import gguf as gguf_mod  # the vendored gguf-py, matching the converter
    import llama_cpp
    from safetensors.numpy import save_file

    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)
    os.makedirs(args.out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ggufgold_")
    only = set(filter(None, args.only.split(",")))
    made = {}
    for name, preset, how, outtype in CASES:
        if only and name not in only:
            continue
        if preset not in made:
            d = os.path.join(tmp, preset)
            run([args.kestrel, "make-model", "--preset", preset, "--out", d], stdout=subprocess.DEVNULL)
            made[preset] = d
        model_dir = made[preset]
        out = os.path.join(args.out_dir, name + ".gguf")

        def convert(outtype_, path):
            run([sys.executable, "-c", CONVERT_SNIPPET, args.llama_cpp_src, model_dir, path, outtype_], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        if how == "convert":
            convert(outtype, out)
        else:
            f32 = os.path.join(tmp, name + "-f32.gguf")
            convert("f32", f32)
            quantize_q4_0(llama_cpp, f32, out)
        reader = gguf_mod.GGUFReader(out)
        vocab_key = next((k for k in reader.fields if k.endswith(".vocab_size")), None)
        if vocab_key is not None:
            vocab = int(reader.fields[vocab_key].contents())
        else:  # converters that write no <arch>.vocab_size (qwen3moe): token_embd.weight is [hidden, vocab]
            vocab = int(next(t for t in reader.tensors if t.name == "token_embd.weight").shape[1])
        prompt = np.random.RandomState(0).randint(0, vocab, N_PROMPT).astype(np.int32)
        exact_path = os.path.join(tmp, name + "-exact-f32.gguf")
        dequantize_gguf(gguf_mod, out, exact_path)
        repack = not name.startswith(NO_REPACK_PREFIX)
        logits = llama_logits(llama_cpp, out, prompt, args.threads, repack)
        exact = llama_logits(llama_cpp, exact_path, prompt, args.threads, repack)
        assert np.all(np.isfinite(logits))
        r = nmse_rows(logits, exact)
        types = tensor_types(gguf_mod, out)
        meta = {
            "reference": "llama.cpp (llama-cpp-python 0.3.36 vendored), f32 KV, CPU",
            "preset": preset,
            "gguf": name + ".gguf",
            "made_by": f"convert_hf_to_gguf.py --outtype {outtype}" if how == "convert" else
                       "convert --outtype f32, then llama_model_quantize MOSTLY_Q4_0 (output, token_embd Q4_0)",
            "tensor_types": ",".join(types),
            "prompt": f"numpy RandomState(0).randint(0, {vocab}, {N_PROMPT})",
            "logits_exact": "llama.cpp on this GGUF with every tensor decoded to F32 by gguf-py (f32 activations)",
            "native_vs_exact_nmse_median": f"{np.median(r):.3e}",
            "native_vs_exact_nmse_max": f"{np.max(r):.3e}",
            "native_vs_exact_rows_nmse_over_1e-2": f"{int(np.sum(r > 1e-2))}/{len(r)}",
            "native_vs_exact_argmax_mismatch_rows": f"{int(np.sum(logits.argmax(1) != exact.argmax(1)))}/{len(r)}",
            "command": recorded_command("gen_gguf_goldens.py"),
        }
        if not repack:
            meta["reference"] += ", weight repacking off (use_extra_bufts = false)"
        save_file({"prompt": prompt, "logits": logits, "logits_exact": exact},
                  os.path.join(args.out_dir, name + ".logits.safetensors"), metadata=meta)
        print(f"[{name}] {os.path.getsize(out)} bytes, types {types}, max|logit| {np.abs(logits).max():.4g}; "
              f"native vs exact decode: NMSE median {np.median(r):.3e} max {np.max(r):.3e}, "
              f"rows > 1e-2: {int(np.sum(r > 1e-2))}/{len(r)}", file=sys.stderr)
    if not only or "blocks" in only:
        block_goldens(gguf_mod, args.blocks_out)
    if not only or "tokenizer" in only:
        tokenizer_golden(gguf_mod, llama_cpp, args.llama_cpp_src, os.path.join(args.out_dir, "k3_micro_q4_0.gguf"),
                         args.tiktoken_dir, args.out_dir)
    if not only or "seeds" in only:
        fuzz_seeds(gguf_mod, os.path.join(args.out_dir, "k3_micro_q4_0.gguf"), args.fuzz_seeds)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
