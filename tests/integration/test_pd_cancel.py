"""Client cancellation through `sglang-router --pd-disaggregation` reaches both workers: a client that closes its
connection while the prompt is still running on the prefill instance, or while the decode instance streams,
leaves no page, no KDA slot and no hand-off in flight on either worker, well before the hand-off deadline
(set to 10 minutes here, so only the cancellation can explain a prompt release)."""
import http.client
import json
import time

import pytest

from conftest import Server
from test_pd_router import GRID, Router, chat

DEADLINE_MS = "600000"
LONG = "Count the ships that pass the lighthouse, one per line, and describe each of them in detail. " * 14


@pytest.fixture(scope="module", params=["tcp", "shm"])
def pd(request):
    env = {"UCX_TLS": request.param}
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", DEADLINE_MS], env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", DEADLINE_MS], env=env)
    router = Router(prefill, decode)
    yield prefill, decode, router
    router.stop()
    for s in (prefill, decode):
        s.stop()


def open_stream(router, prompt, max_tokens):
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn


def nothing_held(server, timeout=20):
    """Polls /metrics until no page, no slot and no hand-off is held; returns the last scrape and whether it did."""
    deadline = time.time() + timeout
    while True:
        m = server.metrics()
        held = (m["kestrel_kv_blocks_used"], m["kestrel_state_slots_used"], m["kestrel_requests_running"],
                m["kestrel_requests_waiting"])
        if held == (0, 0, 0, 0):
            return m, True
        if time.time() > deadline:
            return m, False
        time.sleep(0.05)


def test_disconnect_while_the_prompt_runs_frees_both_sides(pd):
    prefill, decode, router = pd
    conn = open_stream(router, LONG, 64)
    # Wait until both workers hold the request (prefill computing, decode reserved), then hang up.
    deadline = time.time() + 30
    while time.time() < deadline:
        if prefill.metrics()["kestrel_state_slots_used"] > 0 and decode.metrics()["kestrel_state_slots_used"] > 0:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the request never reached both workers")
    conn.close()
    t0 = time.time()
    for s in (prefill, decode):
        m, ok = nothing_held(s)
        assert ok, (s.base, m)
    assert time.time() - t0 < 20  # the hand-off deadline is 600 s
    d = decode.metrics()
    assert d["kestrel_pd_handoffs_in_flight"] == 0 and d["kestrel_pd_quarantined_handoffs"] == 0, d
    # The decode reservation was withdrawn by the prefill (its request ended first) or, had the prefill already
    # parked, the parked request was cancelled there and withdrawn the same way.
    assert d["kestrel_pd_handoffs_withdrawn_total"] >= 1, d
    # The workers are still paired: the next request goes through.
    status, body = chat(router.base, "Hi")
    assert status == 200, body


def test_disconnect_mid_stream_frees_both_sides(pd):
    prefill, decode, router = pd
    conn = open_stream(router, "Tell me about the sea", 400)
    resp = conn.getresponse()
    assert resp.status == 200
    got = b""
    while got.count(b"data:") < 4:
        chunk = resp.read1(4096) if hasattr(resp, "read1") else resp.read(64)
        assert chunk, "the stream ended early"
        got += chunk
    conn.close()
    for s in (prefill, decode):
        m, ok = nothing_held(s)
        assert ok, (s.base, m)
    assert decode.metrics()["kestrel_requests_cancelled_total"] >= 1
