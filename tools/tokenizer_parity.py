#!/usr/bin/env python3
"""Parity of the C++ tokenizer (kestrel_chat) with the reference `tiktoken` package.

Generates a deterministic corpus (multilingual incl. CJK, code, whitespace runs, emoji, random Unicode,
runs past the Kimi 25,000-char cap, documents past the 400,000-char chunk, embedded special tokens), encodes
it with tiktoken and with `tokenize_cli`, and compares every id. Exit status: 0 all equal, 1 mismatch,
2 environment problem (no tiktoken, missing vocabularies). Nothing is skipped silently.

Configurations (each on its own corpus slice):
  cl100k_base, o200k_base, llama3 with their own patterns and specials (tiktoken.Encoding.encode);
  deepseek_v3 with its 3-pass pre-tokenizer (HF `tokenizers` Split passes, as in DeepSeek's tokenizer.json) and
    tiktoken BPE on the byte-level vocabulary;
  the K3/Kimi pattern + tokenization_kimi.py chunk caps + K3 special table on the o200k and cl100k vocabularies;
  the real Kimi vocabulary when --kimi-vocab points to one (tools/extract_vocabs.py writes all of them).

Usage: tokenizer_parity.py --cli build/tok/.../tokenize_cli [--mb 12] [--data-dir DIR] [--kimi-vocab FILE]
"""
import argparse
import base64
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata

try:
    import tiktoken
except ImportError:
    sys.stderr.write("tokenizer_parity.py: FATAL: this python (%s) has no `tiktoken`; install it or point "
                     "KESTREL_PYTHON at a python that has it\n" % sys.executable)
    sys.exit(2)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tokenization_kimi.py pat_str (docs/model-math.md §4.2); tiktoken's fancy-regex understands `&&`.
from kimi_pattern import KIMI_PAT  # noqa: E402  (tools/ is on sys.path: scripts run by path)
LLAMA3_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
DEEPSEEK_PASSES = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]
KIMI_NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
              6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
              19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 65: "<osagent_mode>",
              254: "[UNK]", 255: "[PAD]"}


def kimi_specials(first_id):
    return {KIMI_NAMED.get(k, "<|reserved_token_%d|>" % (first_id + k)): first_id + k for k in range(256)}


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


# ---------------------------------------------------------------------------------------------------------
# Corpus. Random characters come only from code points assigned in this Python's Unicode database (3.11:
# Unicode 14, the same version as PCRE2 10.42), so both engines agree on every character's properties.

def assigned(lo, hi):
    return [chr(c) for c in range(lo, hi) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]


class Corpus:
    WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from or one "
             "had by word but not what all were we when your can said there use an each which she do how their "
             "if will up other about out many then them these so some her would make like him into time has look "
             "two more write go see number no way could people my than first water been call who oil its now find "
             "XMLHttpRequest getElementById HTTPServer iPhone McDonald O'Neil don't I'm we'll they've she'd it's "
             "DON'T WE'LL THEY'RE you'Re naïve café résumé Straße façade coöperate").split()
    SCRIPTS = {
        "han": (0x4E00, 0x9FFF), "han_ext": (0x3400, 0x4DBF), "hiragana": (0x3041, 0x3097), "katakana": (0x30A0, 0x3100),
        "hangul": (0xAC00, 0xD7A4), "cyrillic": (0x0400, 0x0500), "greek": (0x0370, 0x0400), "arabic": (0x0600, 0x0700),
        "hebrew": (0x0590, 0x0600), "devanagari": (0x0900, 0x0980), "thai": (0x0E00, 0x0E80), "latin_ext": (0x0100, 0x0250),
        "combining": (0x0300, 0x0370), "cjk_punct": (0x3000, 0x3040), "fullwidth": (0xFF00, 0xFFF0),
        "han_supp": (0x20000, 0x2A6E0), "math": (0x1D400, 0x1D800), "cjk_compat": (0xF900, 0xFB00),
    }
    EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🏳️‍🌈", "❤️", "🤖", "🧑🏿‍💻", "✨", "🎉", "🔥", "👩‍❤️‍💋‍👨", "☕", "🫠", "1️⃣", "©️"]
    WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\r",
          "\x1c", "\x1f", "\u2003", "\u180e", "\u200b", "\u0085", " \t \n"]
    CODE = [
        "def f(x):\n    return x ** 2  # square\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
        "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v.size(); }\n",
        "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;\r\n",
        "const re = /^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)$/i;\n",
        "{\"key\": [1, 2.5e-3, null, true], \"nested\": {\"a\": \"b\"}}\n",
        "    if x:\n        pass\n\n\n    else:\n\t\t  y = 1_000_000\n",
        "<div class=\"x\">&amp; &lt;tag&gt;</div>\n",
        "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", 0x1F_u8); Ok(()) }\n",
    ]

    def __init__(self, seed, specials, realistic=False):
        self.realistic = realistic  # benchmark mix: mostly prose and code, little random Unicode
        self.r = random.Random(seed)
        self.specials = sorted(specials)
        self.pools = {k: assigned(*v) for k, v in self.SCRIPTS.items()}
        self.all_chars = assigned(0, 0x30000)

    def rand_chars(self, pool, n):
        return "".join(self.r.choice(pool) for _ in range(n))

    def chunk(self):
        r = self.r
        k = r.random()
        if self.realistic:
            k = r.choice([0.0] * 14 + [0.3, 0.5, 0.5, 0.6, 0.75])
        if k < 0.25:
            words = []
            for _ in range(r.randint(3, 60)):
                w = r.choice(self.WORDS)
                if r.random() < 0.1:
                    w = w.upper()
                words.append(w)
                if r.random() < 0.15:
                    words.append(r.choice([",", ".", "!", "?", ";", ":", "'s", "’s", " —", "...", "'LL", "(", ")"]))
                if r.random() < 0.08:
                    words.append(str(r.randint(0, 10 ** r.randint(1, 9))))
            return " ".join(words)
        if k < 0.45:
            pool = self.pools[r.choice(list(self.pools))]
            parts = [self.rand_chars(pool, r.randint(1, 12)) for _ in range(r.randint(1, 12))]
            return r.choice([" ", "", "、", "。", ", ", "\n"]).join(parts)
        if k < 0.58:
            return r.choice(self.CODE)
        if k < 0.70:
            return "".join(r.choice(self.WS) for _ in range(r.randint(1, 12)))
        if k < 0.78:
            return "".join(r.choice(self.EMOJI + [" ", "a", "!"]) for _ in range(r.randint(1, 10)))
        if k < 0.88:
            return self.rand_chars(self.all_chars, r.randint(1, 40))
        if k < 0.94 and self.specials:
            s = r.choice(self.specials)
            return r.choice([s, s + s, " " + s + " ", s[:-1], s[1:], "x" + s + "\n", s.upper()])
        return r.choice(["", "'", "'s", "’", "123456789", "1,234.56", "٣٤٥", "Ⅻ", "½", "a\u0301", "e\u0308\u0323"])

    def doc(self, size):
        out, n = [], 0
        while n < size:
            c = self.chunk()
            out.append(c)
            n += len(c)
        return "".join(out)

    def long_docs(self):
        """Runs around the 25,000-char cap and a document past the 400,000-char outer chunk."""
        r = self.r
        docs = [
            " " * 25_000, " " * 25_001, "x " + " " * 60_000 + "y",
            "a" * 24_999 + " b", "ab" * 13_000,  # 26,000 non-space chars in one run
            "\n" * 30_000, "\u3000" * 25_003 + "end", "\x1c" * 26_000 + "z",  # isspace() but not \s
            "".join(r.choice("abc,.;!0123456789") for _ in range(51_000)),
            "".join(r.choice(self.pools["han"]) for _ in range(27_000)),
            "<|open|>" * 4_000,  # specials cut by the 25,000 cap
        ]
        big = self.doc(420_000)  # crosses the 400,000-char chunk boundary mid-text
        docs.append(big)
        docs.append("word" * 120_000)  # 480,000 non-space chars: caps and chunk boundary together
        return docs


# ---------------------------------------------------------------------------------------------------------
# References.

def split_ws_nonws(s, max_len):  # tokenization_kimi.py _split_whitespaces_or_nonwhitespaces
    cur_len, cur_space, start = 0, (s[0].isspace() if s else False), 0
    for i, ch in enumerate(s):
        sp = ch.isspace()
        if cur_space ^ sp:
            cur_len, cur_space = 1, sp
        else:
            cur_len += 1
            if cur_len > max_len:
                yield s[start:i]
                start, cur_len = i, 1
    yield s[start:]


def kimi_encode(enc, text, allow):  # tokenization_kimi.py encode()
    out = []
    for i in range(0, len(text), 400_000):
        for sub in split_ws_nonws(text[i:i + 400_000], 25_000):
            if allow:
                out.extend(enc.encode(sub, allowed_special="all"))
            else:
                out.extend(enc.encode(sub, disallowed_special=()))
    return out


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_deepseek_reference(ranks):
    from tokenizers import Regex, pre_tokenizers
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
                                   for p in DEEPSEEK_PASSES])
    enc = tiktoken.Encoding("deepseek_v3_bytelevel", pat_str=r"[\s\S]+", mergeable_ranks=ranks, special_tokens={})
    b2u = bytes_to_unicode()

    def encode(text):
        out = []
        for piece, _ in pre.pre_tokenize_str(text):
            mapped = "".join(b2u[b] for b in piece.encode("utf-8")).encode("utf-8")
            out.extend(enc._encode_single_piece(mapped))
        return out
    return encode


# ---------------------------------------------------------------------------------------------------------

def write_docs(path, docs):
    with open(path, "wb") as f:
        for d in docs:
            b = d.encode("utf-8")
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def read_ids(path):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        out.append(list(struct.unpack_from("<%di" % n, data, pos)))
        pos += 4 * n
    return out


def run_config(args, tmp, name, cli_args, ref, docs, specials=None):
    t0 = time.time()
    want = [ref(d) for d in docs]
    t_ref = time.time() - t0
    inp, outp, spf = (os.path.join(tmp, name + s) for s in (".docs", ".ids", ".specials"))
    write_docs(inp, docs)
    cmd = [args.cli] + cli_args + ["--input", inp, "--output", outp, "--roundtrip"]
    if specials is not None:
        with open(spf, "w", encoding="utf-8") as f:
            for text, i in specials.items():
                f.write("%d\t%s\n" % (i, text))
        cmd += ["--specials", spf]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("FAIL %s: tokenize_cli exit %d\n%s" % (name, p.returncode, p.stderr))
        return False, 0
    got = read_ids(outp)
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    bad = 0
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            bad += 1
            if bad <= 3:
                k = next((j for j in range(min(len(g), len(w))) if g[j] != w[j]), min(len(g), len(w)))
                print("MISMATCH %s doc %d (len %d chars) at id %d: cli %s ref %s\n  text near: %r" % (
                    name, i, len(docs[i]), k, g[max(0, k - 3):k + 5], w[max(0, k - 3):k + 5],
                    docs[i][:200] if len(docs[i]) < 200 else "<long doc>"))
    if len(got) != len(want):
        bad += 1
        print("MISMATCH %s: %d docs back, want %d" % (name, len(got), len(want)))
    ntok = sum(len(w) for w in want)
    print("%-26s %s  %7.2f MB  %8d docs  %9d ids  (tiktoken %.1fs)  %s" % (
        name, "ok  " if bad == 0 else "FAIL", mb, len(docs), ntok, t_ref, p.stderr.strip().split(": ", 1)[-1]))
    return bad == 0, mb


GOLDEN_TEXTS = [
    "Hello, world! It's a test.", "  leading spaces and trailing   ", "don't WE'LL they'RE", "1234567 3.14159",
    "日本語のテキストと中文混合。汉字，标点！", "한국어 텍스트", "Привет, мир", "emoji 😀👍🏽👨‍👩‍👧‍👦 🇯🇵",
    "def f(x):\n\treturn x**2\r\n\n\n", "\u00a0\u3000\x1c\u2028 mixed\x0b\x0cspace", "XMLHttpRequest camelCase ALLCAPS",
    "<|endoftext|> and <|open|>x<|close|><|end_of_msg|>[BOS]", "a" * 300, "ab" * 150 + "!", "\u0301\u0308 combining",
    "the quick brown fox jumps over the lazy dog " * 3, "\n\n\n   \n\t\t", "x" + " " * 40 + "y",
]


def write_goldens(path, encoders):
    """Format: name TAB hex(utf8 text) TAB ids (space separated). Small: a few KB."""
    with open(path, "w") as f:
        f.write("# generated by tools/tokenizer_parity.py --write-goldens with tiktoken %s\n" % tiktoken.__version__)
        for name, fn in encoders.items():
            for t in GOLDEN_TEXTS:
                f.write("%s\t%s\t%s\n" % (name, t.encode().hex(), " ".join(map(str, fn(t)))))
    print("wrote", path)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--data-dir", default=os.environ.get("KESTREL_TIKTOKEN_DIR", os.path.join(ROOT, "build", "vocab")),
                    help="directory of the .tiktoken files tools/extract_vocabs.py writes")
    ap.add_argument("--kimi-vocab", default=os.environ.get("KESTREL_KIMI_VOCAB", ""))
    ap.add_argument("--mb", type=float, default=12.0, help="total corpus size over all configurations")
    ap.add_argument("--seed", type=int, default=20260101)
    ap.add_argument("--write-goldens", metavar="FILE", help="write the small unit-test goldens and exit")
    args = ap.parse_args()

    data = args.data_dir
    if not os.path.isfile(os.path.join(data, "cl100k_base.tiktoken")):
        print("tokenizer_parity.py: FATAL: no tiktoken vocabularies in %s (tools/extract_vocabs.py --out-dir %s)"
              % (data, data))
        return 2
    vf = lambda n: os.path.join(data, n + ".tiktoken")

    configs = []  # (name, cli args, ref factory, specials for corpus, specials file or None, long docs?)
    cl = load_ranks(vf("cl100k_base"))
    o2 = load_ranks(vf("o200k_base"))
    ll = load_ranks(vf("llama3"))
    ds = load_ranks(vf("deepseek_v3"))
    cl_sp = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
             "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}
    o2_sp = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
    ll_names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                "<|eot_id|>", "<|python_tag|>"]
    ll_names += ["<|reserved_special_token_%d|>" % i for i in range(2, 2 + 256 - len(ll_names))]
    ll_sp = {t: 128000 + i for i, t in enumerate(ll_names)}

    # The patterns are those of the installed tiktoken's tiktoken_ext/openai_public.py (checked below; its
    # constructors would download the ranks, so the Encoding objects are built from the files in --data-dir).
    import tiktoken_ext.openai_public as op
    src = open(op.__file__, encoding="utf-8").read()
    cl_pat = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    o2_pat = "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])
    if cl_pat not in src or r" ?[^\s\p{L}\p{N}]+[\r\n/]*" not in src:
        print("tokenizer_parity.py: WARNING: installed tiktoken's patterns differ from the ones tested here")

    enc = lambda name, pat, ranks, sp: tiktoken.Encoding(name, pat_str=pat, mergeable_ranks=ranks, special_tokens=sp)
    e_cl, e_o2 = enc("cl100k", cl_pat, cl, cl_sp), enc("o200k", o2_pat, o2, o2_sp)
    e_ll = enc("llama3", LLAMA3_PAT, ll, ll_sp)
    k_o2_sp, k_cl_sp = kimi_specials(len(o2)), kimi_specials(100277)
    e_k_o2 = enc("kimi_o200k", KIMI_PAT, o2, k_o2_sp)
    e_k_cl = enc("kimi_cl100k", KIMI_PAT, cl, k_cl_sp)
    configs += [
        ("cl100k/allow", ["--vocab", vf("cl100k_base"), "--preset", "cl100k"],
         lambda t: e_cl.encode(t, allowed_special="all"), cl_sp, None, False),
        ("o200k/allow", ["--vocab", vf("o200k_base"), "--preset", "o200k"],
         lambda t: e_o2.encode(t, allowed_special="all"), o2_sp, None, False),
        ("o200k/text", ["--vocab", vf("o200k_base"), "--preset", "o200k", "--mode", "text"],
         lambda t: e_o2.encode(t, disallowed_special=()), o2_sp, None, False),
        ("llama3/allow", ["--vocab", vf("llama3"), "--preset", "llama3"],
         lambda t: e_ll.encode(t, allowed_special="all"), ll_sp, None, False),
        ("deepseek_v3/text", ["--vocab", vf("deepseek_v3"), "--preset", "deepseek_v3", "--mode", "text"],
         make_deepseek_reference(ds), {}, None, False),
        ("k3pattern+caps/o200k/allow", ["--vocab", vf("o200k_base"), "--preset", "o200k", "--pattern", "kimi",
                                        "--kimi-caps"], lambda t: kimi_encode(e_k_o2, t, True), k_o2_sp, k_o2_sp, True),
        ("k3pattern+caps/cl100k/text", ["--vocab", vf("cl100k_base"), "--preset", "cl100k", "--pattern", "kimi",
                                        "--kimi-caps", "--mode", "text"],
         lambda t: kimi_encode(e_k_cl, t, False), k_cl_sp, k_cl_sp, True),
    ]
    if args.kimi_vocab:
        if not os.path.isfile(args.kimi_vocab):
            print("tokenizer_parity.py: FATAL: --kimi-vocab %s does not exist" % args.kimi_vocab)
            return 2
        km = load_ranks(args.kimi_vocab)
        e_km = enc("kimi_k3", KIMI_PAT, km, kimi_specials(len(km)))
        configs.append(("kimi_k3/allow", ["--vocab", args.kimi_vocab, "--preset", "kimi"],
                        lambda t: kimi_encode(e_km, t, True), kimi_specials(len(km)), None, True))
    else:
        print("(real Kimi vocabulary not given: --kimi-vocab / KESTREL_KIMI_VOCAB; K3 pattern and caps are "
              "still tested on o200k/cl100k)")

    if args.write_goldens:
        return write_goldens(args.write_goldens, {
            "cl100k": lambda t: e_cl.encode(t, allowed_special="all"),
            "o200k": lambda t: e_o2.encode(t, allowed_special="all"),
            "llama3": lambda t: e_ll.encode(t, allowed_special="all"),
            "deepseek_v3": make_deepseek_reference(ds),
            "k3_on_o200k": lambda t: kimi_encode(e_k_o2, t, True),
        })

    per = args.mb * 1e6 / len(configs)
    ok_all, total = True, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for idx, (name, cli_args, ref, sp, spfile, long_docs) in enumerate(configs):
            corpus = Corpus(args.seed + idx, list(sp))
            docs = corpus.long_docs() if long_docs else []
            size = sum(len(d.encode()) for d in docs)
            while size < per:
                d = corpus.doc(int(corpus.r.choice([200, 1000, 5000, 40000])))
                docs.append(d)
                size += len(d.encode())
            ok, mb = run_config(args, tmp, name.replace("/", "_"), cli_args, ref, docs, spfile)
            ok_all &= ok
            total += mb
    print("parity: %.2f MB over %d configurations: %s" % (total, len(configs), "ALL EQUAL" if ok_all else "MISMATCH"))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
