"""CLI smoke tests on the shipped default model: `kestrel` (no arguments), `generate --prompt`, and an
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


def test_no_arguments_runs_the_shipped_default_model():
    p = run([])
    assert p.returncode == 0, p.stderr
    assert b"shipped default model" in p.stderr and b"RANDOM" not in p.stderr
    assert p.stdout.strip()


def test_generate_prompt_json():
    p = run(["generate", "--prompt", "Hello <|open|> world", "--max-tokens", "6", "--json", "--quiet",
             "--top-logits", "2", "--ignore-eos"])
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert len(j["tokens"]) == 6 and len(j["top_logits"]) == 6
    # One row per generated token, each exactly --top-logits entries, descending; greedy picks the first.
    for tok, row in zip(j["tokens"], j["top_logits"]):
        assert len(row) == 2, row
        assert row[0]["logit"] >= row[1]["logit"], row
        assert tok == row[0]["id"], (tok, row)
    # The special-token string in the prompt was encoded as text: only ordinary ranks, no <|open|> id.
    ranks = sum(1 for _ in open(os.path.join(os.path.dirname(__file__), "..", "..", "models", "default",
                                             "tiktoken.model")))
    assert len(j["prompt_ids"]) > 3 and all(i < ranks for i in j["prompt_ids"]), j["prompt_ids"]


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


def _logits(args, env):
    p = subprocess.run([BIN, "generate", "--prompt-ids", "1,2,3", "--max-tokens", "3", "--json", "--top-logits", "3", *args],
                       capture_output=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["top_logits"]
    assert len(rows) == 3 and all(len(row) == 3 for row in rows), rows  # --max-tokens 3, --top-logits 3
    return [[e["logit"] for e in row] for row in rows]


def test_kernels_flag_selects_the_same_paths_as_the_environment_switches():
    plain = {k: v for k, v in ENV.items() if k not in ("KESTREL_BF16_ACTS", "KESTREL_MXFP4_INT8")}
    exact = _logits([], plain)
    assert _logits(["--kernels", "exact"], plain) == exact
    fast = _logits(["--kernels", "fast"], plain)
    # The default model has BF16 projections and MXFP4 experts: bf16 / int8 activations change the logits
    # (slightly), and exactly as the two environment switches do; --kernels exact overrides them.
    assert fast != exact
    assert max(abs(a - b) for ra, rb in zip(fast, exact) for a, b in zip(ra, rb)) < 0.5
    both = dict(plain, KESTREL_BF16_ACTS="1", KESTREL_MXFP4_INT8="1")
    assert _logits([], both) == fast
    assert _logits(["--kernels", "exact"], both) == exact
    for bad in (["--kernels", "turbo"], ["--kernels"]):
        p = subprocess.run([BIN, "generate", *bad], capture_output=True, env=plain, timeout=60)
        assert p.returncode == 2 and p.stderr.count(b"\n") == 1 and b"--kernels" in p.stderr, p.stderr


def test_kv_cache_dtype_flag():
    # The shipped model's greedy continuation is the same in every cache dtype (its distributions are peaked;
    # docs/architecture.md §3 has the logit drift); fp32 is the default; a bad value is a one-line usage error.
    args = ["generate", "--prompt", "Once upon a time", "--max-tokens", "12", "--json", "--quiet", "--ignore-eos"]
    outs = {}
    for d in [None, "fp32", "bf16", "fp8"]:
        p = run(args + ([] if d is None else ["--kv-cache-dtype", d]))
        assert p.returncode == 0, p.stderr
        outs[d] = json.loads(p.stdout)["tokens"]
    assert outs[None] == outs["fp32"] == outs["bf16"] == outs["fp8"], outs
    p = run(args + ["--kv-cache-dtype", "fp16"])
    assert p.returncode == 2 and p.stderr.count(b"\n") == 1 and b"--kv-cache-dtype" in p.stderr, p.stderr
    # bench reports the dtype and its page bytes per token, from the config's latent shape.
    model = os.path.join(os.path.dirname(__file__), "..", "..", "models", "default")
    cfg = json.load(open(os.path.join(model, "config.json")))
    text = cfg.get("text_config", cfg)
    lora, rope = text["kv_lora_rank"], text["qk_rope_head_dim"]
    row = {"fp32": 4 * (lora + rope), "bf16": 2 * (lora + rope), "fp8": lora + 4 * -(-lora // 128) + 2 * rope}
    per = {}
    for d in row:
        p = run(["bench", "--model", model, "--prompt", "8", "--gen", "2", "--json", "--kv-cache-dtype", d])
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        assert j["kv_cache_dtype"] == d
        per[d] = j["mla_bytes_per_token"]
    layers = per["fp32"] // row["fp32"]
    assert layers > 0 and per == {d: layers * row[d] for d in row}, (per, row)
