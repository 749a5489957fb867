"""`kestrel generate --image FILE` (repeatable) on the shipped default model (K3 architecture with a vision tower in
the released layout): the images' placeholders go before the prompt, `--json` reports the image tokens and encoder
time, the same images give the same tokens, other pixels other top logits, and bad input is a one-line error."""
import json
import os
import subprocess
import tempfile

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
ENV = dict(os.environ, KESTREL_CACHE_DIR=os.environ.get("KESTREL_CACHE_DIR") or
           os.path.join(tempfile.gettempdir(), "kestrel-it-cache"), OMP_NUM_THREADS="1")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "vision")


def generate(*args):
    return subprocess.run([BIN, "generate", "--quiet", "--max-tokens", "4", *args], capture_output=True, env=ENV,
                          timeout=300)


def as_json(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_images_before_the_prompt_counted_and_deterministic():
    args = ["--prompt", "Describe:", "--image", os.path.join(DATA, "rgb.png"), "--image",
            os.path.join(DATA, "palette.png"), "--json", "--top-logits", "3"]
    a, b = as_json(generate(*args)), as_json(generate(*args))
    assert a["image_tokens"] == 10  # 6 + 4
    assert a["encode_seconds"] > 0
    assert a["tokens"] == b["tokens"] and a["top_logits"] == b["top_logits"]
    text_only = as_json(generate("--prompt", "Describe:", "--json"))
    assert len(a["prompt_ids"]) > len(text_only["prompt_ids"]) + 10
    other = as_json(generate("--prompt", "Describe:", "--image", os.path.join(DATA, "rgb.png"), "--image",
                             os.path.join(DATA, "palette_trns.png"), "--json", "--top-logits", "3"))
    assert other["prompt_ids"] == a["prompt_ids"]  # palette_trns.png is 40x33 too
    assert other["top_logits"] != a["top_logits"]


def test_bad_images_are_one_line_errors():
    with tempfile.NamedTemporaryFile(suffix=".png") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
        f.flush()
        p = generate("--image", f.name)
    assert p.returncode == 1
    assert p.stderr.decode().startswith("kestrel: image 1: ") and p.stderr.count(b"\n") == 1, p.stderr
    p = generate("--image", "/nonexistent/cat.png")
    assert p.returncode == 1 and b"--image /nonexistent/cat.png" in p.stderr
    # With --prompt-ids the ids must hold the pads.
    p = generate("--prompt-ids", "1,2,3", "--image", os.path.join(DATA, "rgb.png"))
    assert p.returncode == 1 and b"0 <|media_pad|> positions" in p.stderr and b"6 embedding rows" in p.stderr
