"""`kestrel serve --ep 2` as a cell under mpiexec (docs/cell.md): rank 0 serves HTTP and schedules, every scheduler
step runs on both ranks, and each request's attention state lives on one rank (data-parallel attention). Through
the `openai` client: greedy chat completions with logprobs under 16 concurrent streams (batched across requests,
placed on both ranks) equal those of one `kestrel serve` process bit for bit, and afterwards neither rank holds a
sequence or page; with `--tp 2` the same text and tokens, logprobs within 1e-4; each rank logs the same cache pool bytes; SIGKILL of rank 1
mid-stream ends the client's stream within seconds and the cell non-zero, with no rank left; SIGTERM to mpiexec
ends the stream in flight with a final chunk and stops every rank cleanly. The liveness watchdog (heartbeats on
TCP beside MPI): with a stream in flight (rank 0 waiting in a collective), /health answers 503 naming the rank
as soon as a SIGKILLed rank's connection closes, and within the liveness window for a SIGSTOPped (frozen) rank,
whose cell then ends non-zero at the deadline instead of hanging; no rank is left either way."""
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from conftest import Server, free_port
from mpi_cell import ENV, MPI_FLAGS, MPIEXEC, alive, rank_pids

BINARY = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
CACHE = os.environ.get("KESTREL_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "kestrel-it-cache")
# The random-weight K3 preset with a tokenizer (the tiny presets have none); routed experts in every MoE layer.
SERVE = ["serve", "--preset", "k3-default", "--quiet", "--max-running", "8"]

if not MPIEXEC:
    if os.environ.get("CI"):
        pytest.fail("mpiexec not found (scripts/install-deps.sh installs openmpi-bin)", pytrace=False)
    pytest.skip("mpiexec not found", allow_module_level=True)


class Proc:
    """`kestrel serve` alone or as a cell of `ep` ranks, on a free port, healthy on return."""

    def __init__(self, ep, mpi_extra=(), serve_extra=(), max_context=2048, cache_mib=64):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [BINARY, *SERVE, "--max-context", str(max_context), "--cache-mib", str(cache_mib),
               "--port", str(self.port), *serve_extra]
        if ep > 1:
            cmd = [MPIEXEC, "-np", str(ep), *MPI_FLAGS, "-x", "KESTREL_CACHE_DIR", *mpi_extra, *cmd, "--ep", str(ep)]
        self.log = tempfile.NamedTemporaryFile(prefix="kestrel-cell-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, env=dict(ENV, KESTREL_CACHE_DIR=CACHE), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        Server.started.append(self)  # its log goes into the report if the test fails
        deadline = time.time() + 180
        while time.time() < deadline:
            assert self.proc.poll() is None, "server exited: " + self.text()
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.1)
        else:
            pytest.fail("server did not become healthy: " + self.text())
        # 300 s between two chunks of a stream: the answer tests check bits, not latency, and on a loaded 2-vCPU CI
        # box a cell whose rank 1 is starved for seconds per step (its heartbeat gaps show it) kept requests queued
        # behind 16 streams of 24 tokens for more than 60 s (httpx ReadTimeout in 5 of 16 streams).
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=300)

    def text(self):
        with open(self.log.name) as f:
            return f.read()

    def metric(self, name):
        with urllib.request.urlopen(self.base + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


# For the tests about answers, not liveness: a 2-vCPU CI machine running other suites beside this one starved
# rank 1's heartbeat thread for over 5 s (logged "rank 1 sent no heartbeat for 5000 ms", the default
# --cell-deadline-ms, which then ends the cell as designed for a frozen rank), so these give the watchdog room.
PATIENT = ("--cell-liveness-ms", "5000", "--cell-deadline-ms", "60000")

PROMPTS = ["Hello there", "What is a cell?", "Count: one two three", "Tell me about experts", "zz",
           "Kestrel serves Kimi", "A longer prompt with several more words in it than the others", "ok",
           "Ranks step in lockstep", "Pages and slots", "Nine", "Ten tokens or so, give or take a few",
           "Where does the state live?", "x y z", "Data parallel attention", "The sixteenth stream"]


# A stream that must still be in flight when a rank is signalled: the cell writes chunks ahead of the client's
# reads, and a CI box running other suites beside this one starved the client for longer than the ~3 s that 1600
# tokens took (the stream completed, 'length', before the client reached its 20th chunk). 7800 tokens took 41 s
# on a 2-vCPU Zen 4: far longer than any client stall seen.
LONG = dict(max_context=8192, cache_mib=128)
LONG_TOKENS = 7800


def complete(client, i):
    r = client.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": PROMPTS[i]}],
                                       max_tokens=24, temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True})
    c = r.choices[0]
    lp = [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in c.logprobs.content]
    return c.message.content, getattr(c.message, "reasoning_content", None), c.finish_reason, lp


def stream(client, i):
    """PROMPTS[i] as a stream: the same fields as complete() gathered from the chunks."""
    text, reasoning, finish, lp = "", None, None, []
    for chunk in client.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": PROMPTS[i]}],
                                                max_tokens=24, temperature=0, logprobs=True, top_logprobs=3,
                                                stream=True, extra_body={"ignore_eos": True}):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        text += c.delta.content or ""
        r = getattr(c.delta, "reasoning_content", None)
        if r:
            reasoning = (reasoning or "") + r
        finish = c.finish_reason or finish
        if c.logprobs and c.logprobs.content:
            lp += [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in c.logprobs.content]
    return text, reasoning, finish, lp


def stream_into(out, client, i):
    """stream() for a thread: its result, or the exception it raised (so a failure names its cause)."""
    try:
        out[i] = stream(client, i)
    except Exception as e:  # noqa: BLE001 - reported by the test's assertion
        out[i] = e


def rank_metric(proc, name):
    """{rank: value} of a per-rank gauge on /metrics."""
    out = {}
    with urllib.request.urlopen(proc.base + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{rank="):
                out[int(line.split('"')[1])] = float(line.split()[1])
    return out


def all_concurrently(client):
    out = [None] * len(PROMPTS)

    def run(i):
        out[i] = complete(client, i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_cell_serve_answers_equal_one_process_bit_for_bit():
    one = Proc(1)
    try:
        expected = [complete(one.client, i) for i in range(len(PROMPTS))]  # one at a time
    finally:
        one.close()
    cell = Proc(2, serve_extra=PATIENT)
    try:
        out = [None] * len(PROMPTS)
        threads = [threading.Thread(target=stream_into, args=(out, cell.client, i))
                   for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        held = {0: 0.0, 1: 0.0}  # the most sequences each rank held at once while the streams ran
        while any(t.is_alive() for t in threads):
            for r, n in rank_metric(cell, "kestrel_cell_rank_sequences").items():
                held[r] = max(held[r], n)
            time.sleep(0.05)
        for t in threads:
            t.join()
        batched = cell.metric("kestrel_step_sequences_max")
        after = rank_metric(cell, "kestrel_cell_rank_sequences")
        pages_after = rank_metric(cell, "kestrel_cell_rank_kv_blocks_used")
        log = cell.text()
    finally:
        cell.close()
    assert batched is not None and batched > 1, "the cell never batched requests together"
    assert held[0] >= 1 and held[1] >= 1, f"requests were not placed on both ranks: {held}"
    assert after == {0: 0, 1: 0}, after
    assert pages_after[1] == 0, pages_after  # rank 0 may keep prefix-cache pages; rank 1 keeps nothing
    pool_bytes = [line.split("cache pools ")[1].split()[0] for line in log.splitlines() if "cache pools " in line]
    assert len(pool_bytes) == 2 and pool_bytes[0] == pool_bytes[1], log  # rank 0's line and rank 1's
    for i, (e, g) in enumerate(zip(expected, out)):
        assert isinstance(g, tuple), f"request {i}: {g!r}"
        assert g[2] == "length" and len(g[3]) == 24, g
        assert g == e, f"request {i}: the cell's answer or logprobs differ from one process"  # exact floats


def test_tensor_parallel_cell_serve_answers_equal_one_process():
    # --tp 2: the dense MLP and the shared experts cut over both ranks (docs/cell.md §7) through the same forward
    # path. Under 16 concurrent streams: the same greedy text and tokens as one process; logprobs within the
    # stated fp32 tolerance (the down projection's sum is split in two and added in rank order).
    one = Proc(1)
    try:
        expected = [complete(one.client, i) for i in range(len(PROMPTS))]
    finally:
        one.close()
    cell = Proc(2, serve_extra=("--tp", "2", *PATIENT))
    try:
        out = [None] * len(PROMPTS)
        threads = [threading.Thread(target=stream_into, args=(out, cell.client, i))
                   for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        cell.close()
    worst = 0.0
    for i, (e, g) in enumerate(zip(expected, out)):
        assert isinstance(g, tuple), f"request {i}: {g!r}"
        assert g[:3] == e[:3], f"request {i}: the TP cell's answer differs from one process"
        assert [t[0] for t in g[3]] == [t[0] for t in e[3]], f"request {i}: tokens differ"
        for (_, gl, gtop), (_, el, etop) in zip(g[3], e[3]):
            worst = max(worst, abs(gl - el), *(abs(a[1] - b[1]) for a, b in zip(gtop, etop)))
    print(f"serve --ep 2 --tp 2: max |logprob - one process| = {worst:.3g}")
    assert worst <= 1e-4, worst


def test_sigkill_of_rank_1_mid_stream_ends_the_stream_and_the_cell():
    cell = Proc(2, **LONG)
    try:
        pids = rank_pids(cell.proc.pid)
        assert sorted(pids) == [0, 1], pids
        stream = cell.client.chat.completions.create(
            model="kimi-k3", messages=[{"role": "user", "content": "Go on forever"}], max_tokens=LONG_TOKENS,
            temperature=0, stream=True, extra_body={"ignore_eos": True})
        chunks, killed, ended_by = 0, None, None
        try:
            for chunk in stream:
                chunks += 1
                if chunks == 20:
                    os.kill(pids[1], signal.SIGKILL)
                    killed = time.time()
                if chunk.choices and chunk.choices[0].finish_reason is not None:
                    ended_by = chunk.choices[0].finish_reason
        except Exception as e:  # the error event, or the connection closing
            ended_by = type(e).__name__
        assert killed is not None, "the stream ended before the kill"
        ended = time.time() - killed
        print(f"stream ended {ended:.2f} s after SIGKILL of rank 1 ({ended_by}, {chunks} chunks)")
        assert ended < 5
        assert ended_by != "length", "the stream completed although rank 1 was killed"
        try:
            rc = cell.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the cell is still running 10 s after rank 1 was killed")
        assert rc != 0
        log = cell.text()
        assert "rank 1" in log, log
        deadline = time.time() + 2
        while time.time() < deadline and any(alive(q) for q in pids.values()):
            time.sleep(0.05)
        assert not [r for r, q in pids.items() if alive(q)], "rank processes outlived mpiexec"
    finally:
        cell.close()


def test_sigterm_to_mpiexec_stops_every_rank_cleanly():
    # No drain time: the stream in flight is cancelled at once and ends with a final chunk, not a broken
    # connection (mpirun's SIGTERM reaches rank 0 a second after its own, long before LONG_TOKENS).
    cell = Proc(2, serve_extra=["--drain-seconds", "0"], **LONG)
    try:
        pids = rank_pids(cell.proc.pid)
        assert sorted(pids) == [0, 1], pids
        assert complete(cell.client, 0)[2] == "length"
        stream = cell.client.chat.completions.create(
            model="kimi-k3", messages=[{"role": "user", "content": "Go on"}], max_tokens=LONG_TOKENS, temperature=0,
            stream=True, extra_body={"ignore_eos": True})
        chunks, finish = 0, None
        for chunk in stream:
            chunks += 1
            if chunks == 10:
                cell.proc.send_signal(signal.SIGTERM)
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                finish = chunk.choices[0].finish_reason
        assert finish == "abort", f"the stream in flight ended with {finish} after {chunks} chunks"
        try:
            rc = cell.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("the cell is still running 15 s after SIGTERM")
        log = cell.text()
        print(f"mpiexec exit status after SIGTERM: {rc}")
        # Open MPI's mpirun itself exits 1 when it is signalled; the ranks must have ended on their own, status 0.
        assert "kestrel serve: stopped" in log, log
        assert "kestrel serve: rank 1 of 2: stopped" in log, log
        assert "exited on signal" not in log and "non-zero" not in log, log
        check_no_rank_left(pids)
    finally:
        cell.close()


class HealthPoller(threading.Thread):
    """GET /health every 50 ms until stopped: (time sent, HTTP status or the exception's name, body, time answered).
    On a loaded machine an answer can come long after its request: what the server said before an event is what
    it answered before it."""

    def __init__(self, base):
        super().__init__(daemon=True)
        self.base, self.seen, self.done = base, [], threading.Event()

    def run(self):
        while not self.done.is_set():
            t = time.time()
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    self.seen.append((t, r.status, r.read().decode(), time.time()))
            except urllib.error.HTTPError as e:
                self.seen.append((t, e.code, e.read().decode(), time.time()))
            except Exception as e:  # refused, reset, timed out: the server is going or gone
                self.seen.append((t, type(e).__name__, "", time.time()))
            time.sleep(0.05)

    def stop(self):
        self.done.set()
        self.join(5)


class Streamer(threading.Thread):
    """One long greedy stream; `flowing` is set after 10 chunks; `ended_by` says how it ended."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client, self.flowing, self.ended_by = client, threading.Event(), None

    def run(self):
        try:
            stream = self.client.chat.completions.create(
                model="kimi-k3", messages=[{"role": "user", "content": "Go on forever"}], max_tokens=LONG_TOKENS,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
            for i, chunk in enumerate(stream):
                if i == 10:
                    self.flowing.set()
                if chunk.choices and chunk.choices[0].finish_reason is not None:
                    self.ended_by = chunk.choices[0].finish_reason
        except Exception as e:
            self.ended_by = type(e).__name__


def health_after(poller, t0):
    """The /health answers from t0 on, and the first 503 among them (or None)."""
    after = [s for s in poller.seen if s[0] >= t0]
    first = next((s for s in after if s[1] == 503), None)
    return after, first


def check_no_rank_left(pids):
    # Ranks end on their own right after mpiexec (a busy machine may take a few seconds to run their exit).
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(q) for q in pids.values()):
        time.sleep(0.05)
    assert not [r for r, q in pids.items() if alive(q)], "rank processes outlived mpiexec"


def kill_leftovers(pids):
    for q in pids.values():
        if alive(q):
            os.kill(q, signal.SIGKILL)


def test_sigkill_of_rank_1_fails_health_before_the_cell_ends():
    # A killed rank is noticed by its closed connection, at once, whatever the window: a 5 s window keeps a loaded
    # machine's late heartbeats from answering 503 before the kill.
    cell = Proc(2, serve_extra=["--cell-liveness-ms", "5000"], **LONG)
    pids = {}
    try:
        pids = rank_pids(cell.proc.pid)
        assert sorted(pids) == [0, 1], pids
        poller, streamer = HealthPoller(cell.base), Streamer(cell.client)
        poller.start()
        streamer.start()
        assert streamer.flowing.wait(120), "the stream did not start"
        os.kill(pids[1], signal.SIGKILL)
        killed = time.time()
        try:
            rc = cell.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the cell is still running 10 s after rank 1 was killed")
        poller.stop()
        streamer.join(10)
        assert rc != 0
        # Answered before the kill: healthy. A /health request that timed out (1 s, a loaded machine) says nothing.
        before = [s[1] for s in poller.seen if s[3] < killed and s[1] != "TimeoutError"]
        assert before and set(before) == {200}, before
        after, first = health_after(poller, killed)
        print(f"SIGKILL of rank 1: first 503 {first[0] - killed:.3f} s after, answers "
              f"{[s[1] for s in after]}" if first else f"no 503: {after}")
        assert first is not None, f"/health never answered 503 after rank 1 was killed: {after}"
        assert "rank 1" in first[2], first
        # Healthy until the 503, never healthy again, and the server went away only after it said so.
        until = after[:after.index(first)]
        assert all(s[1] in (200, "TimeoutError") for s in until), until
        assert all(s[1] != 200 for s in after[after.index(first):]), after
        log = cell.text()
        assert "cell unhealthy, /health answers 503: rank 1 closed its liveness connection" in log, log
        assert streamer.ended_by != "length", "the stream completed although rank 1 was killed"
        check_no_rank_left(pids)
    finally:
        kill_leftovers(pids)
        cell.close()


def test_sigstop_of_rank_1_fails_health_within_the_window_then_ends_the_cell():
    window_ms, deadline_ms = 1000, 4000
    cell = Proc(2, serve_extra=["--cell-liveness-ms", str(window_ms), "--cell-deadline-ms", str(deadline_ms)],
                **LONG)
    pids = {}
    try:
        pids = rank_pids(cell.proc.pid)
        assert sorted(pids) == [0, 1], pids
        poller, streamer = HealthPoller(cell.base), Streamer(cell.client)
        poller.start()
        streamer.start()
        assert streamer.flowing.wait(120), "the stream did not start"
        os.kill(pids[1], signal.SIGSTOP)  # frozen, not dead: MPI and mpirun never notice
        stopped = time.time()
        try:
            rc = cell.proc.wait(timeout=deadline_ms / 1000 + 15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the cell is still running {deadline_ms / 1000 + 15:.0f} s after rank 1 was stopped")
        ended = time.time() - stopped
        poller.stop()
        streamer.join(10)
        assert rc != 0
        after, first = health_after(poller, stopped)
        print(f"SIGSTOP of rank 1: first 503 {first[0] - stopped:.3f} s after, cell ended {ended:.2f} s after, "
              f"mpiexec status {rc}" if first else f"no 503: {after}")
        assert first is not None, f"/health never answered 503 after rank 1 was stopped: {after}"
        assert "rank 1 sent no heartbeat" in first[2], first
        # The window, plus one poll and some scheduling slack on a loaded 2-core machine.
        assert first[0] - stopped < window_ms / 1000 + 1.0, first[0] - stopped
        until = after[:after.index(first)]
        assert all(s[1] in (200, "TimeoutError") for s in until), until
        assert all(s[1] != 200 for s in after[after.index(first):]), after
        log = cell.text()
        assert "cell unhealthy, /health answers 503: rank 1 sent no heartbeat" in log, log
        assert "kestrel: rank 0 of 2: cell liveness: rank 1 sent no heartbeat" in log, log
        assert "ending the cell" in log, log
        assert streamer.ended_by != "length", "the stream completed although rank 1 was stopped"
        check_no_rank_left(pids)
    finally:
        for q in pids.values():
            if alive(q):
                os.kill(q, signal.SIGCONT)
        kill_leftovers(pids)
        cell.close()
