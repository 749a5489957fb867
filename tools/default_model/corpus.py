"""English training text from Debian packages, for the embedded default model.

Sources (Debian bookworm packages; licences from each package's /usr/share/doc/PKG/copyright):
  python3.11-doc  /usr/share/doc/python3.11/html   The Python 3.11 documentation (PSF License Version 2;
                                                     code examples also Zero-Clause BSD). Prose paragraphs.
  wordnet-base    /usr/share/wordnet/data.*         WordNet 3.0 (Princeton WordNet licence: use, copy,
                                                     modify and distribute with the copyright notice).
                                                     Synset words + glosses -> dictionary questions/answers.
  fortunes-min    /usr/share/games/fortunes/*       fortune-mod's minimal set (BSD-style licence).

Writes into OUT:
  text_train.txt / text_heldout.txt   paragraphs separated by a blank line (held-out = every 50th document)
  chat_train.jsonl / chat_heldout.jsonl  {"word", "pos", "gloss"} dictionary entries (held-out = every 50th)
Deterministic: same packages -> same files.
"""
import argparse
import glob
import html
import html.parser
import json
import os
import re

DOCS = "/usr/share/doc/python3.11/html"
WORDNET = "/usr/share/wordnet"
FORTUNES = "/usr/share/games/fortunes"
POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


class _Paragraphs(html.parser.HTMLParser):
    """Text of <p>, <li> and <dd> elements inside the page body, one string each; code is skipped."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.cur, self.depth, self.skip = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in ("pre", "script", "style", "code", "table"):
            self.skip += 1
        elif tag in ("p", "li", "dd"):
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in ("pre", "script", "style", "code", "table"):
            self.skip = max(0, self.skip - 1)
        elif tag in ("p", "li", "dd") and self.depth:
            self.depth -= 1
            text = " ".join("".join(self.cur).split())
            self.cur = []
            if text:
                self.out.append(text)

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.cur.append(data)


def prose_ok(p):
    # English sentences: long enough, mostly letters, ends like a sentence.
    if len(p) < 60 or not p[-1] in ".!?:":
        return False
    letters = sum(c.isalpha() or c == " " for c in p)
    return letters / len(p) > 0.85 and p.isascii()


def python_docs():
    for path in sorted(glob.glob(os.path.join(DOCS, "**", "*.html"), recursive=True)):
        if "/_static/" in path or "genindex" in path or "/whatsnew/changelog" in path:
            continue
        parser = _Paragraphs()
        with open(path, encoding="utf-8", errors="replace") as f:
            parser.feed(f.read())
        paras = [p for p in parser.out if prose_ok(p)]
        if paras:
            yield "\n".join(paras)


def fortunes():
    for name in ("fortunes", "literature", "riddles"):
        with open(os.path.join(FORTUNES, name), encoding="utf-8", errors="replace") as f:
            for entry in f.read().split("\n%\n"):
                text = " ".join(entry.split())
                if len(text) >= 20 and text.isascii():
                    yield text


def wordnet():
    """(word, pos, gloss) for every synset: the first word of the synset, the gloss's definition part."""
    for pos_file in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(WORDNET, "data." + pos_file), encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue  # licence header
                head, _, gloss = line.partition(" | ")
                parts = head.split()
                word = parts[4].replace("_", " ")
                word = re.sub(r"\([a-z]+\)$", "", word)  # adjective markers like (a), (p)
                gloss = gloss.strip().split(";")[0].strip()
                if not gloss or not word.isascii() or not gloss.isascii() or len(gloss) < 8:
                    continue
                yield word, POS[parts[2]], gloss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    docs = list(python_docs()) + list(fortunes())
    n_text = [0, 0]
    with open(os.path.join(a.out, "text_train.txt"), "w") as tr, open(os.path.join(a.out, "text_heldout.txt"), "w") as ho:
        for i, d in enumerate(docs):
            (ho if i % 50 == 49 else tr).write(d + "\n\n")
            n_text[i % 50 == 49] += len(d)
    n_chat = [0, 0]
    with open(os.path.join(a.out, "chat_train.jsonl"), "w") as tr, open(os.path.join(a.out, "chat_heldout.jsonl"), "w") as ho:
        for i, (w, p, g) in enumerate(wordnet()):
            (ho if i % 50 == 49 else tr).write(json.dumps({"word": w, "pos": p, "gloss": g}) + "\n")
            n_chat[i % 50 == 49] += 1
    print(f"corpus: {len(docs)} documents, {n_text[0]} train / {n_text[1]} held-out characters; "
          f"{n_chat[0]} train / {n_chat[1]} held-out dictionary entries")


if __name__ == "__main__":
    main()
