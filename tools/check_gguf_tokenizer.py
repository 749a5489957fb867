#!/usr/bin/env python3
"""Kestrel's GGUF tokenizer vs llama.cpp's tokenizer at full vocabulary scale (a check, not a ctest).

Builds a metadata-only GGUF whose tokenizer is written exactly as llama.cpp's converter writes Kimi's
(tools/gen_gguf_goldens.py write_tokenizer_gguf: GPT-2 byte-level strings, merges from QwenModel.bpe,
CONTROL specials, pre "kimi-k2") from a tiktoken vocabulary — by default the real Kimi one
($KESTREL_KIMI_VOCAB, 163,584 ranks) with K3's 256-entry special table after it — then tokenizes a corpus
(docs/, src/, the tokenizer golden texts) with llama_cpp (vocab_only, special=False) and with
`tokenize_cli --gguf FILE --mode text`, and reports mismatching documents. Exit 0 iff all ids agree.

    python tools/check_gguf_tokenizer.py --cli build/release/tests/unit/chat/tokenize_cli \\
        --llama-cpp-src <sdist>/vendor/llama.cpp [--vocab $KESTREL_KIMI_VOCAB]
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_gguf_goldens as gg  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--llama-cpp-src", required=True)
    ap.add_argument("--vocab", default=os.environ.get("KESTREL_KIMI_VOCAB", ""))
    ap.add_argument("--specials-config", default=os.path.expanduser("~/.cache/kestrel/model-k3-default-v3/"
                                                                    "tokenizer_config.json"),
                    help="tokenizer_config.json whose added_tokens_decoder gives the special names in id order")
    args = ap.parse_args()
    if not args.vocab:
        sys.exit("no --vocab and no KESTREL_KIMI_VOCAB")
    sys.path.insert(0, os.path.join(args.llama_cpp_src, "gguf-py"))
    import gguf as gguf_mod
    import llama_cpp

    ranks = gg.read_tiktoken(args.vocab)
    n = len(ranks)
    with open(args.specials_config) as f:
        dec = json.load(f)["added_tokens_decoder"]
    names = [dec[k]["content"] for k in sorted(dec, key=int)]
    specials = {s: n + i for i, s in enumerate(names)}
    tmp = tempfile.mkdtemp(prefix="ggtok_")
    path = os.path.join(tmp, "tok.gguf")
    gg.write_tokenizer_gguf(gguf_mod, args.llama_cpp_src, os.path.join(ROOT, "tests/data/gguf/k3_micro_q4_0.gguf"),
                            ranks, specials, path)
    docs = [t.encode() for t in gg.TOKENIZER_TEXTS if t]
    for pat in ("docs/*.md", "README.md", "src/*/*.cpp", "src/*/*.h", "tools/*.py"):
        for p in sorted(glob.glob(os.path.join(ROOT, pat))):
            with open(p, "rb") as f:
                docs.append(f.read())
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    ref = [llm.tokenize(d, add_bos=False, special=False) for d in docs]
    llm.close()
    inp, out = os.path.join(tmp, "docs.bin"), os.path.join(tmp, "ids.bin")
    with open(inp, "wb") as f:
        for d in docs:
            f.write(struct.pack("<I", len(d)) + d)
    subprocess.run([args.cli, "--gguf", path, "--mode", "text", "--input", inp, "--output", out], check=True)
    got, b, pos = [], open(out, "rb").read(), 0
    while pos < len(b):
        (c,) = struct.unpack_from("<I", b, pos)
        got.append(list(struct.unpack_from(f"<{c}i", b, pos + 4)))
        pos += 4 + 4 * c
    bad = [i for i, (r, g) in enumerate(zip(ref, got)) if r != g]
    total = sum(len(d) for d in docs)
    print(f"vocab {args.vocab}: {n} ranks + {len(specials)} specials; {len(docs)} docs, {total} bytes, "
          f"{sum(map(len, ref))} ids; mismatching docs: {len(bad)}")
    for i in bad[:5]:
        r, g = ref[i], got[i]
        k = next((j for j in range(min(len(r), len(g))) if r[j] != g[j]), min(len(r), len(g)))
        print(f"  doc {i}: first difference at id {k}: llama.cpp {r[k:k+5]} vs kestrel {g[k:k+5]}")
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if bad or len(got) != len(ref) else 0)


if __name__ == "__main__":
    main()
