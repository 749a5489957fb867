#!/usr/bin/env python3
"""Rebuild the tiktoken-format vocabularies the tests use from the `splintr-rs` package (PyPI).

splintr ships each vocabulary inside its wheel; `Tokenizer.from_pretrained(NAME).decode_token_bytes(id)` gives a
token's bytes, and with the id as rank that is exactly tiktoken's file format (`base64(bytes) SP rank` per line,
in rank order). Written, each with its check:

  cl100k_base.tiktoken  100,256 ranks; SHA-256 equal to the `expected_hash` that the installed tiktoken's
                        `tiktoken_ext/openai_public.py` pins for OpenAI's published file, so the file is byte for byte
                        the one tiktoken itself would download
  o200k_base.tiktoken   199,998 ranks; SHA-256 checked the same way
  llama3.tiktoken       128,000 ranks; SHA-256 equal to Meta's `original/tokenizer.model` of Llama 3 (pinned below)
  deepseek_v3.tiktoken  128,000 ranks in the GPT-2 byte-level form (the payload is the `bytes_to_unicode` string of
                        the token's bytes, as DeepSeek's tokenizer.json stores it); ranks 0-2 are the three special
                        entries of that table, stored as their text
  kimi_k3.tiktoken      163,584 ranks; SHA-256 equal to Kimi K3's released `tiktoken.model` (pinned below);
                        [BOS] = 163584 is the first special

For every file: ids unique and contiguous from 0, all 256 single bytes present (raw-byte files), the rank count
above, and a sample of text encoded by tiktoken on the file just written equal to splintr's own encoding of it.
Output ~12 MB in all, not committed (scripts/test.sh writes build/vocab/).

  tools/extract_vocabs.py --out-dir build/vocab [--only cl100k_base,kimi_k3]
"""
import argparse
import base64
import hashlib
import os
import sys

# name -> (splintr name, rank count, byte-level form, first special id that must follow the ranks)
VOCABS = {
    "cl100k_base": ("cl100k_base", 100_256, False, 100_257),
    "o200k_base": ("o200k_base", 199_998, False, 199_999),
    "llama3": ("llama3", 128_000, False, None),
    "deepseek_v3": ("deepseek_v3", 128_000, True, None),
    "kimi_k3": ("kimi", 163_584, False, 163_584),
}
# DeepSeek V3's table starts with three entries that are not byte-level strings (tokenizer.json model.vocab 0-2).
DEEPSEEK_HEAD = ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
                 "<\uff5c\u2581pad\u2581\uff5c>"]
# SHA-256 of the released files (the Git LFS object ids on the Hugging Face model repositories
# meta-llama/Meta-Llama-3-8B `original/tokenizer.model`, 2,183,982 bytes, and moonshotai/Kimi-K3 `tiktoken.model`,
# 2,795,286 bytes; the same ids are quoted by many public projects that pin these files). OpenAI's two are read from
# the installed tiktoken instead.
PINNED = {
    "llama3": "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
    "kimi_k3": "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103",
}
SAMPLE = ("Hello, world! The quick brown fox jumps over the lazy dog 12345 times.\n\n"
          "  def f(x):\n\treturn x ** 2  # squares\n"
          "Grüße aus München — naïve café, 東京タワー, Привет мир, مرحبا, 🙂🚀, ÀÉÎÕÜ 1,000,000.00\n" * 3)


def bytes_to_unicode():
    """GPT-2's byte -> printable code point table (openai/gpt-2 encoder.py, also in HF tokenizers' ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiktoken_expected_hash(name):
    """The SHA-256 the installed tiktoken pins for OpenAI's file `name` (read from its constructor, not typed here)."""
    import tiktoken_ext.openai_public as op
    seen = {}

    def capture(url, expected_hash=None):
        seen["hash"] = expected_hash
        raise LookupError  # stop before any download

    real = op.load_tiktoken_bpe
    op.load_tiktoken_bpe = capture
    try:
        getattr(op, name)()
    except LookupError:
        pass
    finally:
        op.load_tiktoken_bpe = real
    return seen.get("hash"), op


def fail(msg):
    sys.exit("extract_vocabs.py: " + msg)


def build(name, out_dir):
    import splintr
    sp_name, n_ranks, byte_level, first_special = VOCABS[name]
    tok = splintr.Tokenizer.from_pretrained(sp_name)
    b2u = bytes_to_unicode()
    seen, lines, raw = {}, [], []
    for i in range(n_ranks):
        if byte_level and i < len(DEEPSEEK_HEAD):
            payload = b = DEEPSEEK_HEAD[i].encode()
            if tok.special_token_id(DEEPSEEK_HEAD[i]) != i:
                fail("%s: id %d is not %s" % (name, i, DEEPSEEK_HEAD[i]))
        else:
            b = bytes(tok.decode_token_bytes(i))
            if not b:
                fail("%s: id %d decodes to no bytes" % (name, i))
            payload = "".join(b2u[x] for x in b).encode() if byte_level else b
        if b in seen:
            fail("%s: ids %d and %d decode to the same bytes" % (name, seen[b], i))
        seen[b] = i
        raw.append(b)
        lines.append(base64.b64encode(payload).decode() + " " + str(i))
    # The ranks end where the table does: id n_ranks is not another mergeable token, and where the vocabulary
    # names its first special id, that id is a special of splintr's table.
    specials = tok.special_tokens()
    if first_special is not None and first_special not in specials.values():
        fail("%s: id %d is not a special token" % (name, first_special))
    try:
        extra = bytes(tok.decode_token_bytes(n_ranks))
    except ValueError:
        extra = b""
    if extra and specials.get(extra.decode("utf-8", "replace")) != n_ranks:
        fail("%s: id %d still decodes to a mergeable token (%r): more than %d ranks" % (name, n_ranks, extra, n_ranks))
    singles = set(bytes([x]) for x in range(256))
    if not singles <= set(raw):
        fail("%s: single bytes missing" % name)
    text = "\n".join(lines) + "\n"
    final = os.path.join(out_dir, name + ".tiktoken")
    path = final + ".part"  # renamed only once every check has passed
    with open(path, "w") as f:
        f.write(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    checks = ["%d ranks" % n_ranks]

    if name in ("cl100k_base", "o200k_base"):
        want, op = tiktoken_expected_hash(name)
        if not want:
            fail("%s: the installed tiktoken pins no hash for this file" % name)
        if digest != want:
            fail("%s: SHA-256 %s differs from tiktoken's pinned %s" % (name, digest, want))
        checks.append("SHA-256 = tiktoken's pinned hash")
        # tiktoken on the file just written, with its own pattern and specials, against splintr.
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        ctor = getattr(op, name)
        op_load = op.load_tiktoken_bpe
        op.load_tiktoken_bpe = lambda url, expected_hash=None: load_tiktoken_bpe(path, expected_hash=want)
        try:
            spec = ctor()
        finally:
            op.load_tiktoken_bpe = op_load
        enc = tiktoken.Encoding(**spec)
        if enc.encode_ordinary(SAMPLE) != list(tok.encode_ordinary(SAMPLE)):
            fail("%s: tiktoken and splintr encode the sample differently" % name)
        checks.append("tiktoken(file) == splintr on a %d-byte sample" % len(SAMPLE.encode()))
    elif name in PINNED:
        if digest != PINNED[name]:
            fail("%s: SHA-256 %s differs from the released file's %s" % (name, digest, PINNED[name]))
        checks.append("SHA-256 = the released file's")
    if name in PINNED:
        # tiktoken on the file, with the pre-tokenizer pattern splintr uses, must reproduce splintr.
        import tiktoken
        pat = {"llama3": splintr.LLAMA3_PATTERN, "kimi_k3": splintr.KIMI_PATTERN}[name]
        enc = tiktoken.Encoding(name, pat_str=pat, mergeable_ranks={b: i for i, b in enumerate(raw)},
                                special_tokens={})
        if enc.encode_ordinary(SAMPLE) != list(tok.encode_ordinary(SAMPLE)):
            fail("%s: tiktoken and splintr encode the sample differently" % name)
        checks.append("tiktoken(file) == splintr on a %d-byte sample" % len(SAMPLE.encode()))
    if byte_level:
        checks.append("encodings checked by the committed goldens (tests/unit/chat/data/tiktoken_goldens.tsv)")
    os.replace(path, final)
    print("wrote %s: %s; sha256 %s" % (final, ", ".join(checks), digest[:16]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(VOCABS))
    args = ap.parse_args()
    try:
        import splintr  # noqa: F401
    except ImportError:
        fail("no `splintr` module (pip install splintr-rs)")
    names = [n for n in args.only.split(",") if n] or list(VOCABS)
    for n in names:
        if n not in VOCABS:
            fail("unknown vocabulary %r (known: %s)" % (n, ", ".join(VOCABS)))
    os.makedirs(args.out_dir, exist_ok=True)
    for n in names:
        build(n, args.out_dir)


if __name__ == "__main__":
    main()
