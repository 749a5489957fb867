"""`kestrel bench` modes used by bench/llama_cpp_compare.py: the llama-bench pp/tg protocol (--pp/--tg/--reps)
and the correctness gate (--gate-*), on the committed llama.cpp-converted micro GGUF (tests/data/gguf)."""
import json
import os
import subprocess
import tempfile

import numpy as np
import pytest
from safetensors.numpy import load_file

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
ENV = dict(os.environ, OMP_NUM_THREADS="1")
GGUF_DIR = os.path.join(os.path.dirname(__file__), "..", "data", "gguf")
Q4 = os.path.join(GGUF_DIR, "k3_micro_q4_0.gguf")


def run(args, env=None):
    return subprocess.run([BIN, *args], capture_output=True, env=env or ENV, timeout=300)


# The exact path (fp32 activations): the golden is llama.cpp on the F32-decoded file.
EXACT = {**ENV, "KESTREL_GGUF_INT8": "0"}


def test_pp_tg_protocol_json():
    p = run(["bench", "--model", Q4, "--threads", "1", "--pp", "16", "--tg", "5", "--reps", "3", "--json"])
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["threads"] == 1
    for k, n in (("pp", 16), ("tg", 5)):
        r = j[k]
        assert r["n_tokens"] == n and len(r["seconds"]) == 3 and len(r["tok_s"]) == 3
        assert all(s > 0 for s in r["seconds"])
        assert len(r["cores_used"]) == 3 and all(0 < c < 8 for c in r["cores_used"])
        assert np.isclose(r["tok_s_mean"], np.mean([n / s for s in r["seconds"]]))
        assert np.isclose(r["tok_s_sd"], np.std([n / s for s in r["seconds"]], ddof=1))


def test_pp_only_and_bad_values_are_one_line_errors():
    p = run(["bench", "--model", Q4, "--pp", "8", "--tg", "0", "--reps", "1", "--json"])
    assert p.returncode == 0, p.stderr
    assert "pp" in json.loads(p.stdout) and "tg" not in json.loads(p.stdout)
    for bad in (["--reps", "0"], ["--pp", "0", "--tg", "0"], ["--pp", "-1"], ["--threads", "0", "--pp", "4"],
                ["--pp", "x"]):
        p = run(["bench", "--model", Q4, *bad])
        assert p.returncode != 0 and p.stderr.count(b"\n") == 1, (bad, p.stderr)


def test_gate_logits_match_llama_cpp_exact_decode_and_greedy_tokens_match_generate():
    # Golden from tools/gen_gguf_goldens.py: llama.cpp on the same file with every tensor decoded to F32 by
    # gguf-py (`logits_exact`), fp32 activations; bound as tests/models/gguf_test (2e-4, same argmax).
    g = load_file(os.path.join(GGUF_DIR, "k3_micro_q4_0.logits.safetensors"))
    prompt = [int(t) for t in g["prompt"]]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "gate.f32")
        p = run(["bench", "--model", Q4, "--gate-ids", ",".join(map(str, prompt)), "--gate-gen", "4", "--gate-out", out], EXACT)
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        rows = np.fromfile(out, dtype=np.float32).reshape(4, j["vocab"])
    ref = g["logits_exact"][len(prompt) - 1]
    assert np.max(np.abs(rows[0] - ref)) <= 2e-4
    assert j["generated"][0] == int(np.argmax(ref))
    assert j["generated"] == [int(np.argmax(r)) for r in rows]
    gen = run(["generate", "--model", Q4, "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", "4", "--json",
               "--quiet"], EXACT)
    assert gen.returncode == 0, gen.stderr
    assert json.loads(gen.stdout)["tokens"] == j["generated"]


@pytest.mark.parametrize("name", ["deepseek_v3_micro_q4_0", "deepseek_v2_lite_micro_q4_0"])
def test_deepseek2_gguf_pp_tg_and_gate_match_llama_cpp_exact_decode(name):
    # deepseek2 files (llama.cpp's converter + llama_model_quantize Q4_0) of DeepSeek V3 structure and of
    # DeepSeek-V2-Lite structure (no q_lora: attn_q; softmax greedy routing; 27 layers): the pp/tg protocol runs
    # on them, and the gate's logits are llama.cpp's on the file's exact F32 decode (2e-4).
    ds = os.path.join(GGUF_DIR, name + ".gguf")
    p = run(["bench", "--model", ds, "--threads", "1", "--pp", "16", "--tg", "5", "--reps", "2", "--json"])
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["pp"]["n_tokens"] == 16 and j["tg"]["n_tokens"] == 5 and j["pp"]["tok_s_mean"] > 0
    g = load_file(os.path.join(GGUF_DIR, name + ".logits.safetensors"))
    prompt = [int(t) for t in g["prompt"]]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "gate.f32")
        p = run(["bench", "--model", ds, "--gate-ids", ",".join(map(str, prompt)), "--gate-gen", "3", "--gate-out", out], EXACT)
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        rows = np.fromfile(out, dtype=np.float32).reshape(3, j["vocab"])
    ref = g["logits_exact"][len(prompt) - 1]
    assert np.max(np.abs(rows[0] - ref)) <= 2e-4
    assert j["generated"][0] == int(np.argmax(ref))


def test_gate_rejects_out_of_vocab_ids_and_unwritable_output():
    p = run(["bench", "--model", Q4, "--gate-ids", "1,99999999", "--gate-out", "/tmp/x.f32"])
    assert p.returncode != 0 and b"outside the vocabulary" in p.stderr
    p = run(["bench", "--model", Q4, "--gate-ids", "1,2", "--gate-out", "/nonexistent-dir/x.f32"])
    assert p.returncode != 0 and b"cannot write" in p.stderr
    p = run(["bench", "--model", Q4, "--gate-ids", "1,2"])
    assert p.returncode != 0 and b"go together" in p.stderr


def test_default_mode_reports_cache_and_snapshot_bytes():
    p = run(["bench", "--model", Q4, "--threads", "1", "--prompt", "8", "--gen", "2", "--json"])
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    # A prefix-cache snapshot is one slot's KDA state (conv + recurrent of every KDA layer, fp32 at rest).
    assert j["prefix_snapshot_bytes"] == j["kda_slot_bytes_per_request"] > 0
    assert j["mla_bytes_per_token"] > 0
