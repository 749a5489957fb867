"""Byte-level BPE trainer that writes a vocabulary in Kimi K3's format.

Output (the files a K3 checkpoint ships, docs/model-math.md §4.1 / §4.4):
  tiktoken.model          one rank per line: base64(token bytes) SP rank; ranks 0..255 are the single bytes
                          (byte value = rank), then one rank per merge in training order.
  tokenizer_config.json   added_tokens_decoder with K3's 256 special / reserved ids right after the last rank
                          (same names and offsets as Kestrel's kimi_k3_specials and the k3 presets).

Pre-tokenisation is K3's pattern (tokenization_kimi.py pat_str; the `regex` module needs V1 for the `&&` class
intersection). Merges are counted inside pre-tokens only, like tiktoken's encoder applies them.

    python bpe.py --text corpus/text_train.txt --chat corpus/chat_train.jsonl --ranks 5888 --out DIR
"""
import argparse
import base64
import collections
import heapq
import json
import os

import regex

K3_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# Offsets from the first special id (Kestrel src/chat/tokenizer.cpp kimi_k3_specials, spec §4.4).
K3_NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
            6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
            19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 65: "<osagent_mode>",
            254: "[UNK]", 255: "[PAD]"}


def k3_specials(first_id):
    return {K3_NAMED.get(k, f"<|reserved_token_{first_id + k}|>"): first_id + k for k in range(256)}


def pretokens(texts):
    pat = regex.compile(K3_PATTERN, flags=regex.V1)
    counts = collections.Counter()
    for t in texts:
        counts.update(pat.findall(t))
    return counts


def train(word_counts, n_ranks):
    """Returns the list of token byte strings, index = rank."""
    vocab = [bytes([b]) for b in range(256)]
    words = [list(w.encode("utf-8")) for w in word_counts]  # token ids per word
    freq = list(word_counts.values())
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[i]
            where[(a, b)].add(i)
    # Max-heap keyed by (-count, pair bytes) so ties break deterministically (lexicographically smallest bytes).
    heap = [(-c, vocab[p[0]] + vocab[p[1]], p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < n_ranks and heap:
        negc, _, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or -negc <= 0:
            continue  # stale entry
        new_id = len(vocab)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        touched = set()
        for i in list(where[pair]):
            w = words[i]
            f = freq[i]
            j, out = 0, []
            changed = False
            while j < len(w):
                if j + 1 < len(w) and w[j] == pair[0] and w[j + 1] == pair[1]:
                    out.append(new_id)
                    j += 2
                    changed = True
                else:
                    out.append(w[j])
                    j += 1
            if not changed:
                continue
            for a, b in zip(w, w[1:]):
                pair_count[(a, b)] -= f
                touched.add((a, b))
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += f
                where[(a, b)].add(i)
                touched.add((a, b))
            words[i] = out
        del where[pair]
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, vocab[p[0]] + vocab[p[1]], p))
            elif p in pair_count:
                del pair_count[p]
    return vocab


def write(vocab, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tiktoken.model"), "w") as f:
        for rank, tok in enumerate(vocab):
            f.write(base64.b64encode(tok).decode() + " " + str(rank) + "\n")
    added = {str(i): {"content": name, "special": True} for name, i in k3_specials(len(vocab)).items()}
    added = dict(sorted(added.items(), key=lambda kv: int(kv[0])))
    cfg = {"tokenizer_class": "TikTokenTokenizer", "added_tokens_decoder": added, "bos_token": "[BOS]",
           "eos_token": "<|end_of_msg|>", "pad_token": "[PAD]", "model_max_length": 1048576}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def load_encoding(model_dir):
    """tiktoken Encoding for a vocabulary written by `write` (what Kestrel loads from the same files)."""
    import tiktoken
    ranks = {}
    with open(os.path.join(model_dir, "tiktoken.model")) as f:
        for line in f:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return tiktoken.Encoding("k3-default", pat_str=K3_PATTERN, mergeable_ranks=ranks,
                             special_tokens=k3_specials(len(ranks)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", required=True)
    ap.add_argument("--chat", required=True, help="chat_train.jsonl from corpus.py (its words and glosses)")
    ap.add_argument("--ranks", type=int, default=5888, help="normal tokens; the vocabulary is ranks + 256")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    texts = open(a.text).read().split("\n\n")
    with open(a.chat) as f:
        for line in f:
            e = json.loads(line)
            texts.append(f"What does \"{e['word']}\" mean? {e['word']} ({e['pos']}): {e['gloss']}.")
    counts = pretokens(texts)
    vocab = train(counts, a.ranks)
    write(vocab, a.out)
    print(f"bpe: {len(counts)} distinct pre-tokens, {len(vocab)} ranks + 256 specials -> {a.out}")


if __name__ == "__main__":
    main()
