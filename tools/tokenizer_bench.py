#!/usr/bin/env python3
"""Encode throughput (MB/s, one thread) of the C++ tokenizer vs the reference `tiktoken` on the same text.

Text: a deterministic realistic mix (English prose ~70%, code, CJK/other scripts, whitespace, emoji) from the
parity corpus generator, plus the parity corpus itself ("stress": random Unicode, long runs).
Usage: tokenizer_bench.py --bench build/tok/tokenizer_bench [--mb 8] [--data-dir DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_parity as tp  # noqa: E402  (exits 2 if tiktoken is missing)
import tiktoken  # noqa: E402

CL100K = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
O200K = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path to the tokenizer_bench binary")
    ap.add_argument("--data-dir", default=os.path.join(tp.ROOT, "..", "shared", "data", "tiktoken"))
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    texts = {}
    for kind, realistic in (("realistic", True), ("stress", False)):
        c = tp.Corpus(7, [], realistic=realistic)
        parts, n = [], 0
        while n < args.mb * 1e6:
            d = c.doc(5000)
            parts.append(d)
            n += len(d.encode())
        texts[kind] = "".join(parts)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab, preset, pat in (("cl100k_base", "cl100k", CL100K), ("o200k_base", "o200k", O200K),
                                   ("o200k_base", "kimi", tp.KIMI_PAT)):
            path = os.path.join(args.data_dir, vocab + ".tiktoken")
            ranks = tp.load_ranks(path)
            enc = tiktoken.Encoding(preset, pat_str=pat, mergeable_ranks=ranks, special_tokens={})
            for kind, text in texts.items():
                mb = len(text.encode()) / 1e6
                best = 1e30
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    if preset == "kimi":  # Kimi's own encode(): chunk caps, then tiktoken per slice
                        ref = tp.kimi_encode(enc, text, False)
                    else:
                        ref = enc.encode(text, disallowed_special=())  # one thread
                    best = min(best, time.perf_counter() - t0)
                tt = mb / best
                f = os.path.join(tmp, kind + ".txt")
                with open(f, "wb") as fh:
                    fh.write(text.encode())
                cmd = [args.bench, "--vocab", path, "--pattern", preset, "--input", f, "--repeat", str(args.repeat)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
                cpp, ntok = float(out[0]), int(out[1])
                if ntok != len(ref):
                    print("WARNING: %s %s %s: %d ids vs tiktoken %d" % (vocab, preset, kind, ntok, len(ref)))
                rows.append((vocab, preset, kind, mb, tt, cpp))
    print("%-12s %-7s %-10s %7s %14s %14s %7s" % ("vocab", "pattern", "text", "MB", "tiktoken MB/s", "kestrel MB/s", "ratio"))
    for v, p, k, mb, tt, cpp in rows:
        print("%-12s %-7s %-10s %7.2f %14.2f %14.2f %6.2fx" % (v, p, k, mb, tt, cpp, cpp / tt))


if __name__ == "__main__":
    main()
