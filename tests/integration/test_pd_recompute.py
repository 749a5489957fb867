"""A decode worker started with `--handoff-failure recompute` answers a request whose hand-off failed by running it
from its prompt, as a colocated server runs it: the client gets the colocated answer bit for bit (text, float32
logprobs and top logprobs), not an error. Two ways a hand-off fails here: the prefill killed with SIGKILL while it
computes the prompt (after the decode advertised its destinations; hand-off deadlines of 10 minutes, so only the
death ends the hand-off), and a prefill that cannot be reached at all. Under the default, `fail`, the same kill
reaches the client as the hand-off's error. Either way the decode holds nothing afterwards."""
import http.client
import json

import pytest

from conftest import Server, free_port
from test_pd_cancel import DEADLINE_MS, LONG, nothing_held, open_leg, wait_until
from test_pd_router import GRID, chat, same_logprobs

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def colocated():
    s = Server(GRID)
    yield s
    s.stop()


def leg(worker, bootstrap_port, room, prompt):
    """One leg the way sglang-router sends it (not streamed, with logprobs, as `chat` asks the colocated one)."""
    conn = http.client.HTTPConnection("127.0.0.1", worker.port, timeout=120)
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "logprobs": True, "top_logprobs": 3, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap_port, "bootstrap_room": room}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn


def answer(conn):
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}")


def failed_total(m):
    return sum(v for k, v in m.items() if k.startswith("kestrel_pd_handoffs_failed_total"))


@pytest.mark.parametrize("tls,policy", [("tcp", "recompute"), ("shm", "recompute"), ("tcp", "fail")])
def test_prefill_killed_while_it_computes_the_prompt(colocated, tls, policy):
    status, want = chat(colocated.base, LONG, MAX_TOKENS)
    assert status == 200, want
    env = {"UCX_TLS": tls}
    # Chunks of 8 tokens: the prompt (about 1,400 tokens) takes about 2 s; the decode advertises within that.
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", DEADLINE_MS, "--prefill-chunk", "8"],
                     env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", DEADLINE_MS, "--handoff-failure", policy],
                    env=env)
    try:
        p_leg = leg(prefill, prefill.port, 931, LONG)
        d_leg = leg(decode, prefill.port, 931, LONG)
        wait_until(lambda: decode.metrics()["kestrel_pd_handoffs_advertised_total"] == 1, "room 931 never advertised")
        m = prefill.metrics()
        assert m["kestrel_state_slots_used"] == 1 and m["kestrel_pd_handoffs_in_flight"] == 0, \
            ("the prefill's prompt must still run when it dies", m)
        prefill.proc.kill()
        prefill.proc.wait(timeout=30)
        p_leg.close()
        status, got = answer(d_leg)
        d = decode.metrics()
        assert failed_total(d) == 1, d
        assert d["kestrel_pd_handoffs_completed_total"] == 0, d
        if policy == "recompute":
            assert status == 200, got
            assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
            assert same_logprobs(got, want), (got, want)
            assert d["kestrel_pd_handoffs_recomputed_total"] == 1, d
            assert d["kestrel_pd_recompute_refused_total"] == 0, d
        else:
            assert status >= 500, got
            assert "hand-off from prefill failed" in json.dumps(got), got
            assert "kestrel_pd_handoffs_recomputed_total" not in d, d
        m, ok = nothing_held(decode)
        assert ok, m
        # The failed hand-off's memory comes back once the dead prefill can no longer write into it.
        wait_until(lambda: decode.metrics()["kestrel_pd_quarantined_handoffs"] == 0, "decode memory quarantined", 20)
        assert decode.proc.poll() is None
    finally:
        decode.stop()
        if prefill.proc.poll() is None:
            prefill.stop()


def test_hang_up_reaches_the_request_run_here():
    """The client's cancel reaches the request once it runs here: nothing is held long before its 400 tokens."""
    env = {"UCX_TLS": "tcp"}
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", DEADLINE_MS, "--prefill-chunk", "8"],
                     env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", DEADLINE_MS, "--handoff-failure",
                            "recompute"], env=env)
    try:
        p_leg = open_leg(prefill, prefill, 933, LONG, 400)
        d_leg = open_leg(decode, prefill, 933, LONG, 400)
        wait_until(lambda: decode.metrics()["kestrel_pd_handoffs_advertised_total"] == 1, "room 933 never advertised")
        prefill.proc.kill()
        prefill.proc.wait(timeout=30)
        p_leg.close()
        r = d_leg.getresponse()
        assert r.status == 200
        r.read1(1)  # the stream has begun
        wait_until(lambda: decode.metrics()["kestrel_pd_handoffs_recomputed_total"] == 1, "never recomputed")
        wait_until(lambda: decode.metrics()["kestrel_requests_running"] == 1, "the request does not run here")
        d_leg.close()
        m, ok = nothing_held(decode, timeout=10)
        assert ok, m
        assert m["kestrel_generation_tokens_total"] < 400, m
        assert m["kestrel_requests_cancelled_total"] == 1, m
    finally:
        decode.stop()
        if prefill.proc.poll() is None:
            prefill.stop()


def test_unreachable_prefill_is_run_here(colocated):
    status, want = chat(colocated.base, "Tell me about the sea", MAX_TOKENS)
    assert status == 200, want
    decode = Server(GRID + ["--role", "decode", "--handoff-failure", "recompute"], env={"UCX_TLS": "tcp"})
    try:
        status, got = answer(leg(decode, free_port(), 932, "Tell me about the sea"))  # nothing listens there
        assert status == 200, got
        assert same_logprobs(got, want), (got, want)
        d = decode.metrics()
        assert d["kestrel_pd_handoffs_recomputed_total"] == 1, d
        assert d["kestrel_pd_handoffs_started_total"] == 0, d
        m, ok = nothing_held(decode)
        assert ok, m
    finally:
        decode.stop()


def test_recompute_is_refused_outside_the_decode_role():
    for role in ("prefill", "both"):
        s = None
        with pytest.raises(RuntimeError) as e:
            s = Server(GRID + ["--role", role, "--handoff-failure", "recompute"])
        if s is not None:
            s.stop()
        assert "decode role" in str(e.value), e.value
