"""Tokenises the corpus (corpus.py) with the trained vocabulary (bpe.py) into training arrays.

Text documents: each document's text + "\\n\\n", encoded as plain text (no specials).
Dictionary entries become one K3 XTML chat each, rendered segment by segment exactly as Kestrel's renderer
(src/chat/k3_renderer.cpp) renders a user turn and an assistant turn with thinking on (the default of
`kestrel chat`): structural markers are special ids, every other piece is encoded on its own.

    python prepare.py --corpus DIR --vocab DIR --out data.npz
"""
import argparse
import json
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

QUESTIONS = ['What does "{w}" mean?', 'What is the meaning of "{w}"?', 'Define "{w}".', 'What does {w} mean?',
             "Explain the word {w}.", "What is {w}?"]


def render_segments(messages, generation_prompt=False):
    """[(text, is_control)] for [(role, reasoning, content)], as k3_renderer.cpp (thinking on, no effort)."""
    out = []
    control = lambda t: out.append((t, True))
    text = lambda t: t and out.append((t, False))

    def open_tag(tag, attrs=()):
        control("<|open|>")
        text(tag)
        for k, v in attrs:
            text(" " + k)
            text('="')
            text(v.replace("&", "&amp;").replace('"', "&quot;"))
            text('"')
        control("<|sep|>")

    def close_tag(tag):
        control("<|close|>")
        text(tag)
        control("<|sep|>")

    for role, reasoning, content in messages:
        open_tag("message", [("role", role)])
        if role == "assistant":
            open_tag("think")
            text(reasoning or "")
            close_tag("think")
            open_tag("response")
            text(content)
            close_tag("response")
        else:
            text(content)
        close_tag("message")
        control("<|end_of_msg|>")
    if generation_prompt:
        open_tag("message", [("role", "assistant")])
        open_tag("think")
    return out


def encode_segments(enc, segments):
    ids = []
    for t, ctl in segments:
        ids += enc.encode(t, allowed_special="all") if ctl else enc.encode_ordinary(t)
    return ids


def dictionary_chat(e, rng):
    w, pos, gloss = e["word"], e["pos"], e["gloss"]
    q = rng.choice(QUESTIONS).format(w=w)
    article = "an" if pos[0] in "aeiou" else "a"
    reasoning = f'The user asks about the word "{w}". It is {article} {pos}.'
    answer = f'"{w}" ({pos}) means: {gloss}.'
    return [("user", None, q), ("assistant", reasoning, answer)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    enc = bpe.load_encoding(a.vocab)
    rng = random.Random(0)
    arrays = {}
    for split in ("train", "heldout"):
        docs = [d for d in open(os.path.join(a.corpus, f"text_{split}.txt")).read().split("\n\n") if d.strip()]
        toks = [np.array(enc.encode_ordinary(d + "\n\n"), dtype=np.int32) for d in docs]
        arrays[f"text_{split}"] = np.concatenate(toks)
        arrays[f"text_{split}_offsets"] = np.cumsum([0] + [len(t) for t in toks]).astype(np.int64)
        chats = []
        with open(os.path.join(a.corpus, f"chat_{split}.jsonl")) as f:
            for line in f:
                chats.append(np.array(encode_segments(enc, render_segments(dictionary_chat(json.loads(line), rng))),
                                      dtype=np.int32))
        arrays[f"chat_{split}"] = np.concatenate(chats)
        arrays[f"chat_{split}_offsets"] = np.cumsum([0] + [len(t) for t in chats]).astype(np.int64)
        print(f"{split}: {len(docs)} documents, {len(arrays[f'text_{split}'])} text tokens; {len(chats)} chats, "
              f"{len(arrays[f'chat_{split}'])} chat tokens")
    np.savez_compressed(a.out, **arrays)


if __name__ == "__main__":
    main()
