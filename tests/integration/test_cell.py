"""`kestrel generate --ep E` as a cell under mpiexec (docs/cell.md): greedy tokens equal to one process for the
tiny K3, K3 with DSA layers, Kimi Linear, DeepSeek V3 and V3.2 models at EP 2 and 4; every rank binds the
replicated weights plus about 1/E of the routed-expert bytes; flag errors; and a SIGKILLed rank ends the cell
non-zero within 10 s, mpirun naming the rank, with no rank process left behind; a SIGSTOPped (frozen) rank, rank 0
included, ends the cell non-zero at the liveness deadline instead of hanging it; `--numa node` binds each rank and
changes no result; `--tp 2` (tensor-parallel dense MLPs and shared experts) gives one process's tokens, logits
within the stated tolerance and each rank's bytes as `plan --cell --tp 2` predicts."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from mpi_cell import ENV, MPI_FLAGS, MPIEXEC, alive, rank_pids

BINARY = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
PROMPT = "3,14,15,92,65,35,89,79,32,38,46,26,43,38,32,79,50,28,84,19,71,69,39,93,75,10"

if not MPIEXEC:
    if os.environ.get("CI"):
        pytest.fail("mpiexec not found (scripts/install-deps.sh installs openmpi-bin)", pytrace=False)
    pytest.skip("mpiexec not found", allow_module_level=True)


@pytest.fixture(scope="module")
def models():
    d = tempfile.mkdtemp(prefix="kestrel-cell-")
    out = {}
    for preset in ["k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny", "deepseek-v3-tiny", "deepseek-v32-sparse-tiny"]:
        out[preset] = os.path.join(d, preset)
        subprocess.run([BINARY, "make-model", "--preset", preset, "--out", out[preset]], check=True,
                       capture_output=True, env=ENV)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def generate(model, ep, *extra):
    cmd = [BINARY, "generate", model, "--prompt-ids", PROMPT, "--max-tokens", "12", "--ignore-eos", "--json",
           "--quiet", "--chunk", "7", *extra]
    if ep > 1:
        cmd = [MPIEXEC, "-np", str(ep), *MPI_FLAGS, *cmd, "--ep", str(ep)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("preset", ["k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny", "deepseek-v3-tiny",
                                    "deepseek-v32-sparse-tiny"])
def test_cell_tokens_and_logits_equal_one_process(models, preset):
    one = generate(models[preset], 1, "--top-logits", "5")
    for ep in (2, 4):
        cell = generate(models[preset], ep, "--top-logits", "5")
        assert cell["tokens"] == one["tokens"], f"EP {ep}"
        assert cell["top_logits"] == one["top_logits"], f"EP {ep}: top logits differ"  # exact floats
        ranks = cell["cell"]["ranks"]
        assert [r["rank"] for r in ranks] == list(range(ep))
        assert cell["cell"]["steps"] == 4 + 11  # 26 prompt tokens in chunks of 7, then 11 decode steps
        assert all(r["moe_bytes_sent"] > 0 for r in ranks)


def plan(model, ep, *extra):
    r = subprocess.run([BINARY, "plan", "--model", model, "--cell", "--ep", str(ep), "--json", *extra],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("preset", ["k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny", "deepseek-v3-tiny",
                                    "deepseek-v32-sparse-tiny"])
def test_plan_predicts_each_ranks_weight_bytes_exactly(models, preset):
    for ep in (2, 4):
        measured = [r["weight_bytes"] for r in generate(models[preset], ep)["cell"]["ranks"]]
        predicted = [r["weight_bytes"] for r in plan(models[preset], ep)["ranks"]]
        assert measured == predicted, f"EP {ep}"


@pytest.mark.parametrize("preset", ["k3-tiny", "k3-tiny-dsa", "kimi-linear-tiny", "deepseek-v3-tiny",
                                    "deepseek-v32-sparse-tiny"])
def test_tensor_parallel_cell_tokens_equal_one_process_and_bytes_equal_the_plan(models, preset):
    # --tp 2: the dense MLPs and shared experts cut over groups of 2 ranks (docs/cell.md §7). Greedy tokens
    # equal one process's; the top logits within the stated fp32 tolerance (1e-5 of max(1, |logit|)); each
    # rank's bound bytes equal `plan --cell --tp 2`'s, below the EP-only rank's (it holds slices).
    one = generate(models[preset], 1, "--top-logits", "5")
    for ep in (2, 4):
        cell = generate(models[preset], ep, "--top-logits", "5", "--tp", "2")
        assert cell["tokens"] == one["tokens"], f"EP {ep} TP 2"
        assert len(cell["top_logits"]) == len(one["top_logits"])
        for got, want in zip(cell["top_logits"], one["top_logits"]):
            scale = max(1.0, max(abs(e["logit"]) for e in want))
            assert [e["id"] for e in got] == [e["id"] for e in want], (got, want)
            assert all(abs(g["logit"] - w["logit"]) <= 1e-5 * scale for g, w in zip(got, want)), (got, want)
        assert cell["cell"]["tp"] == 2
        ranks = cell["cell"]["ranks"]
        assert all(r["tp_bytes_sent"] > 0 for r in ranks)
        measured = [r["weight_bytes"] for r in ranks]
        assert measured == [r["weight_bytes"] for r in plan(models[preset], ep, "--tp", "2")["ranks"]], f"EP {ep}"
        ep_only = [r["weight_bytes"] for r in plan(models[preset], ep)["ranks"]]
        assert all(m < e for m, e in zip(measured, ep_only)), (measured, ep_only)


def test_tp_must_divide_the_ranks(models):
    r = subprocess.run([MPIEXEC, "-np", "2", *MPI_FLAGS, BINARY, "generate", models["k3-tiny"], "--prompt-ids", "1,2",
                        "--ep", "2", "--tp", "4"], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode != 0 and "--tp 4 must divide the cell's 2 ranks" in r.stderr, r.stderr
    r = subprocess.run([BINARY, "plan", "--model", models["k3-tiny"], "--cell", "--ep", "4", "--tp", "3"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 2 and "--tp 3 must divide --ep 4" in r.stderr, r.stderr


def test_each_rank_binds_its_share_of_the_experts(models):
    # 30 BF16 experts: an uneven split at EP 4 (7, 8, 7, 8 experts) and a large routed share.
    d = tempfile.mkdtemp(prefix="kestrel-cell-bytes-")
    try:
        m = os.path.join(d, "m")
        subprocess.run([BINARY, "make-model", "--preset", "k3-tiny", "--experts", "30", "--bf16-experts", "--out", m],
                       check=True, capture_output=True, env=ENV)
        one = generate(m, 1)
        p4 = plan(m, 4)
        assert [r["experts"] for r in p4["ranks"]] == [7, 8, 7, 8]
        assert one["weight_bytes"] == p4["replicated_bytes"] + p4["routed_bytes"]
        for ep in (2, 4):
            cell = generate(m, ep)
            assert cell["tokens"] == one["tokens"]
            w = [r["weight_bytes"] for r in cell["cell"]["ranks"]]
            p = plan(m, ep)
            assert w == [r["weight_bytes"] for r in p["ranks"]]
            routed = [x - p["replicated_bytes"] for x in w]
            assert sum(routed) == p["routed_bytes"]  # every expert bound exactly once
            for r in p["ranks"]:  # each rank: its experts' share of the routed bytes
                assert routed[r["rank"]] == p["routed_bytes"] * r["experts"] // 30
            print(f"EP {ep}: per-rank weight bytes {w} (one process {one['weight_bytes']})")
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("preset", ["k3-tiny", "deepseek-v32-sparse-tiny"])
def test_bench_in_a_cell_reports_bytes_equal_to_the_computed_and_planned_ones(models, preset):
    for ep in (2, 4):
        r = subprocess.run([MPIEXEC, "-np", str(ep), *MPI_FLAGS, BINARY, "bench", "--model", models[preset], "--ep",
                            str(ep), "--prompt", "24", "--chunk", "10", "--gen", "6", "--batch", "5", "--json"],
                           capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout.strip().splitlines()[-1])
        assert j["ep"] == ep and len(j["ranks"]) == ep
        assert j["decode_step_bytes_measured"] == j["decode_step_bytes_computed"] > 0
        assert 0 < j["decode_step_moe_bytes"] < j["decode_step_bytes_measured"]
        assert j["decode_step_bytes_planned_uniform_routing"] > 0
        assert sum(x["sequences"] for x in j["ranks"]) == 5
        for x in j["ranks"]:
            assert x["decode_bytes_sent_measured"] == x["decode_bytes_sent_computed"], x
            assert x["weight_bytes"] == x["planned_weight_bytes"], x
            assert x["cache_bytes"] == x["planned_cache_bytes"], x


def test_ep_must_match_the_job(models):
    r = subprocess.run([BINARY, "generate", models["k3-tiny"], "--prompt-ids", "1,2", "--ep", "2"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 2 and "--ep 2 needs exactly 2 ranks" in r.stderr, r.stderr
    r = subprocess.run([MPIEXEC, "-np", "2", *MPI_FLAGS, BINARY, "generate", models["k3-tiny"], "--prompt-ids", "1,2",
                        "--ep", "4"], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode != 0 and "needs exactly 4 ranks" in r.stderr, r.stderr


def test_sigkill_of_a_rank_ends_the_cell_within_ten_seconds(models):
    cmd = [MPIEXEC, "-np", "4", *MPI_FLAGS, BINARY, "generate", models["k3-tiny"], "--prompt-ids", PROMPT,
           "--max-tokens", "1000000", "--ignore-eos", "--quiet", "--ep", "4"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                         start_new_session=True)
    try:
        deadline = time.time() + 60
        pids = {}
        while time.time() < deadline and len(pids) < 4:
            assert p.poll() is None, p.stderr.read()
            pids = rank_pids(p.pid)
            time.sleep(0.1)
        assert len(pids) == 4, f"ranks found: {pids}"
        time.sleep(3)  # well inside the decode loop (the model loads in well under a second)
        assert p.poll() is None, "the cell ended before the kill"
        os.kill(pids[2], signal.SIGKILL)
        killed = time.time()
        try:
            rc = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the cell is still running 10 s after rank 2 was killed")
        elapsed = time.time() - killed
        err = p.stderr.read()
        print(f"cell ended {elapsed:.2f} s after SIGKILL of rank 2 (exit {rc})")
        assert rc != 0
        assert "rank 2" in err, err
        deadline = time.time() + 2
        while time.time() < deadline and any(alive(q) for q in pids.values()):
            time.sleep(0.05)
        assert not [r for r, q in pids.items() if alive(q)], "rank processes outlived mpirun"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.parametrize("frozen", [2, 0])
def test_sigstop_of_a_rank_ends_the_cell_at_the_liveness_deadline(models, frozen):
    # MPI never notices a stopped rank; the liveness heartbeats do: rank 0 watches the others, they watch rank 0.
    deadline_s = 2
    cmd = [MPIEXEC, "-np", "4", *MPI_FLAGS, BINARY, "generate", models["k3-tiny"], "--prompt-ids", PROMPT,
           "--max-tokens", "1000000", "--ignore-eos", "--quiet", "--ep", "4", "--cell-liveness-ms", "500",
           "--cell-deadline-ms", str(deadline_s * 1000)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                         start_new_session=True)
    pids = {}
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(pids) < 4:
            assert p.poll() is None, p.stderr.read()
            pids = rank_pids(p.pid)
            time.sleep(0.1)
        assert len(pids) == 4, f"ranks found: {pids}"
        time.sleep(3)  # inside the decode loop
        assert p.poll() is None, "the cell ended before the stop"
        os.kill(pids[frozen], signal.SIGSTOP)
        stopped = time.time()
        try:
            rc = p.wait(timeout=deadline_s + 15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the cell is still running {deadline_s + 15} s after rank {frozen} was stopped")
        elapsed = time.time() - stopped
        err = p.stderr.read()
        print(f"cell ended {elapsed:.2f} s after SIGSTOP of rank {frozen} (exit {rc})")
        assert rc != 0
        assert f"cell liveness: rank {frozen} sent no heartbeat" in err, err
        assert "ending the cell (--cell-deadline-ms 2000)" in err, err
        assert elapsed >= deadline_s - 0.5, elapsed  # the deadline counts from the last beat, at most 0.1 s before
        deadline = time.time() + 2
        while time.time() < deadline and any(alive(q) for q in pids.values()):
            time.sleep(0.05)
        assert not [r for r, q in pids.items() if alive(q)], "rank processes outlived mpirun"
    finally:
        for q in pids.values():
            if alive(q):
                os.kill(q, signal.SIGCONT)
                os.kill(q, signal.SIGKILL)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_numa_node_binds_every_rank_and_changes_no_result(models):
    """`--numa node`: each rank binds to its host's node (round robin of local ranks; on a one-node host node 0
    for both) and says so; the tokens and logits are the unbound cell's. A bad mode is a usage error."""
    model = models["k3-tiny"]
    want = generate(model, 2, "--top-logits", "5")
    cmd = [MPIEXEC, "-np", "2", *MPI_FLAGS, BINARY, "generate", model, "--prompt-ids", PROMPT, "--max-tokens", "12",
           "--ignore-eos", "--json", "--chunk", "7", "--top-logits", "5", "--ep", "2", "--numa", "node"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["tokens"] == want["tokens"] and got["top_logits"] == want["top_logits"]
    def has_memory(node):  # "Node 0 MemTotal:  24576000 kB"
        with open(f"/sys/devices/system/node/node{node}/meminfo") as f:
            return any(l.split()[2] == "MemTotal:" and int(l.split()[3]) > 0 for l in f if len(l.split()) > 3)
    nodes = sorted(n for n in (int(d[4:]) for d in os.listdir("/sys/devices/system/node")
                               if d.startswith("node") and d[4:].isdigit()) if has_memory(n))
    for rank in (0, 1):
        line = next((l for l in r.stderr.splitlines() if l.startswith(f"kestrel: rank {rank} of 2: NUMA node")), None)
        assert line is not None, r.stderr
        assert line.startswith(f"kestrel: rank {rank} of 2: NUMA node {nodes[rank % len(nodes)]} of {len(nodes)} "), line
        assert line.endswith("memory bound"), line
    bad = subprocess.run([BINARY, "generate", model, "--prompt-ids", "1,2", "--numa", "socket"], capture_output=True,
                         text=True, env=ENV, timeout=60)
    assert bad.returncode == 2 and "--numa must be off, auto or node" in bad.stderr, bad.stderr
