"""CLI smoke tests on the embedded default model: `kestrel` (no arguments), `generate --prompt`, and an
interactive `chat` session fed through stdin (two turns, then EOF)."""
import json
import os
import subprocess
import tempfile

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
ENV = dict(os.environ, KESTREL_CACHE_DIR=os.environ.get("KESTREL_CACHE_DIR") or
           os.path.join(tempfile.gettempdir(), "kestrel-it-cache"), OMP_NUM_THREADS="1")


def run(args, stdin=None):
    return subprocess.run([BIN, *args], input=stdin, capture_output=True, env=ENV, timeout=300)


def test_no_arguments_runs_default_model_and_says_weights_are_random():
    p = run([])
    assert p.returncode == 0, p.stderr
    assert b"RANDOM weights" in p.stderr


def test_generate_prompt_json():
    p = run(["generate", "--prompt", "Hello <|open|> world", "--max-tokens", "6", "--json", "--quiet",
             "--top-logits", "2"])
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert len(j["tokens"]) == 6 and len(j["top_logits"]) == 6
    # The special-token string in the prompt was encoded as text, not as the <|open|> id.
    assert len(j["prompt_ids"]) == len("Hello <|open|> world".encode())


def test_chat_two_turns_over_stdin():
    p = run(["chat", "--quiet", "--max-tokens", "6", "--hide-thinking"], stdin=b"first question\nsecond one\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(b"\n") >= 2  # one reply line per turn


def test_bad_model_dir_is_one_line_error():
    with tempfile.TemporaryDirectory() as d:
        p = run(["generate", "--model", d, "--prompt-ids", "1,2", "--quiet"])
        assert p.returncode != 0
        assert p.stderr.count(b"\n") == 1 and d.encode() in p.stderr


GGUF_DIR = os.path.join(os.path.dirname(__file__), "..", "data", "gguf")


def test_generate_from_gguf_with_prompt_ids():
    # llama.cpp-converted Q4_0 K3 file without a tokenizer: ids in, ids out.
    p = run(["generate", "--model", os.path.join(GGUF_DIR, "k3_micro_q4_0.gguf"), "--prompt-ids", "1,2,3",
             "--max-tokens", "4", "--json", "--quiet"])
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["tokens"]) == 4


def test_generate_from_gguf_without_tokenizer_rejects_text_prompt():
    path = os.path.join(GGUF_DIR, "k3_micro_q8_0.gguf")
    p = run(["generate", "--model", path, "--prompt", "hello", "--quiet"])
    assert p.returncode != 0
    assert p.stderr.count(b"\n") == 1 and b"--prompt-ids" in p.stderr and b"tokenizer.ggml.model" in p.stderr
