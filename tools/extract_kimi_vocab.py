#!/usr/bin/env python3
"""Reconstruct Kimi K2/K3's `tiktoken.model` (163,584 BPE ranks) from the `splintr-rs` package's `kimi` vocab.

Each id below the base vocabulary size decodes (splintr `decode_token_bytes`) to that token's bytes; with the id
as rank this is exactly tiktoken's file. Checked against spec §7: 163,584 ranks, ids unique and contiguous, all
256 single bytes present, vocab with specials 163,840. The output (~2.3 MB) is not committed.

  pip install splintr-rs   (or: pip download splintr-rs --no-deps; unzip the wheel; --splintr-path DIR)
  tools/extract_kimi_vocab.py --out build/kimi/tiktoken.model
  KESTREL_KIMI_VOCAB=build/kimi/tiktoken.model ctest -R Kimi          # unit test on the real vocabulary
  tools/tokenizer_parity.py --cli ... --kimi-vocab build/kimi/tiktoken.model
"""
import argparse
import base64
import os
import sys

EXPECTED_RANKS = 163_584
EXPECTED_VOCAB = 163_840


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--splintr-path", help="directory holding an unpacked splintr-rs wheel")
    args = ap.parse_args()
    if args.splintr_path:
        sys.path.insert(0, args.splintr_path)
    try:
        import splintr
    except ImportError:
        sys.exit("extract_kimi_vocab.py: no `splintr` module (pip install splintr-rs, or --splintr-path)")
    base = splintr.base_vocab_size("kimi")
    tok = splintr.Tokenizer.from_pretrained("kimi")
    if base not in (EXPECTED_RANKS, EXPECTED_VOCAB):
        sys.exit("splintr base_vocab_size(kimi) = %d, expected %d ranks (+256 specials)" % (base, EXPECTED_RANKS))
    seen = {}
    lines = []
    for i in range(EXPECTED_RANKS):
        b = bytes(tok.decode_token_bytes(i))
        if not b:
            sys.exit("id %d decodes to no bytes" % i)
        if b in seen:
            sys.exit("ids %d and %d decode to the same bytes" % (seen[b], i))
        seen[b] = i
        lines.append(base64.b64encode(b).decode() + " " + str(i))
    missing = [x for x in range(256) if bytes([x]) not in seen]
    if missing:
        sys.exit("single bytes missing: %s" % missing[:10])
    # The next id must be the first special ([BOS] = 163584 in spec §7), not another mergeable token.
    bos = tok.special_token_id("[BOS]") if hasattr(tok, "special_token_id") else None
    if bos is not None and bos != EXPECTED_RANKS:
        sys.exit("[BOS] is %s, expected %d" % (bos, EXPECTED_RANKS))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s: %d ranks (splintr base_vocab_size(kimi) = %d, vocab_size %d)" % (
        args.out, len(lines), base, tok.vocab_size))


if __name__ == "__main__":
    main()
