"""Client cancellation through `sglang-router --pd-disaggregation` reaches both workers: a client that closes its
connection while the prompt is still running on the prefill instance, or while the decode instance streams,
leaves no page, no KDA slot and no hand-off in flight on either worker, well before the hand-off deadline
(set to 10 minutes here, so only the cancellation can explain a prompt release). A hang-up that reaches only the
decode worker (its two legs sent the way the router sends them, then only the decode connection closed) releases
the prefill's request too, through the decode's cancel message. A decode worker stopped by SIGTERM calls off the
hand-offs it abandons the same way, so the prefill does not run, park and then fail them."""
import http.client
import json
import signal
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
    # The decode called the hand-off off (its own client's cancel), and its reservation came back without
    # quarantine: withdrawn by the prefill, or stopped by it, or never advertised.
    assert d["kestrel_pd_handoffs_cancelled_total"] >= 1, d
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


@pytest.fixture(scope="module", params=["tcp", "shm"])
def pd_one_slot(request):
    """A prefill and a decode worker without a router; the decode decodes one sequence at a time (one KDA slot),
    so a second request waits for admission there while its prefill leg has already parked."""
    env = {"UCX_TLS": request.param}
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", DEADLINE_MS], env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", DEADLINE_MS, "--max-running", "1"], env=env)
    yield prefill, decode
    for s in (prefill, decode):
        s.stop()


def open_leg(worker, prefill, room, prompt, max_tokens):
    """One leg of a request the way sglang-router sends it: the same body to both workers, with the prefill's
    bootstrap address and the room that pairs them."""
    conn = http.client.HTTPConnection("127.0.0.1", worker.port, timeout=60)
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.port,
            "bootstrap_room": room}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn


def wait_until(predicate, what, timeout=30):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            pytest.fail(what)
        time.sleep(0.02)


def test_hang_up_reaching_only_the_decode_releases_the_prefill(pd_one_slot):
    prefill, decode = pd_one_slot
    p0, d0 = prefill.metrics(), decode.metrics()
    # The decode's one slot is taken by a reservation whose prefill leg never comes (room 901): it would wait for
    # its state until the 600 s deadline.
    holder = open_leg(decode, prefill, 901, "Hi", 8)
    wait_until(lambda: decode.metrics()["kestrel_state_slots_used"] == 1, "room 901 never reserved")
    # Room 902: the prefill leg runs to its first token and parks, waiting for destinations; the decode leg waits
    # for admission behind room 901 (nothing advertised yet).
    p_leg = open_leg(prefill, prefill, 902, LONG, 16)
    d_leg = open_leg(decode, prefill, 902, LONG, 16)
    wait_until(lambda: prefill.metrics()["kestrel_pd_handoffs_in_flight"] == 1, "room 902 never parked")
    wait_until(lambda: decode.metrics()["kestrel_requests_waiting"] == 1, "room 902 never queued on the decode")
    d_leg.close()  # the client hangs up on the decode worker only; the prefill leg stays connected
    t0 = time.time()
    resp = p_leg.getresponse()
    assert resp.status == 200
    resp.read()  # the prefill's stream ends (its request cancelled), well within the connection's 60 s timeout
    m, ok = nothing_held(prefill)
    assert ok, m
    # One scrape reads the hand-off counts and the pools at slightly different times: poll the count too.
    wait_until(lambda: prefill.metrics()["kestrel_pd_handoffs_in_flight"] == 0, "prefill hand-off still in flight", 20)
    m = prefill.metrics()
    print(f"prefill released {time.time() - t0:.2f} s after the hang-up")
    assert time.time() - t0 < 20, "released at the deadline, not by the cancel"  # the deadline is 600 s
    assert m["kestrel_pd_cancel_messages_total"] - p0["kestrel_pd_cancel_messages_total"] == 1, m
    assert m["kestrel_pd_handoffs_cancelled_total"] - p0["kestrel_pd_handoffs_cancelled_total"] == 1, m
    assert m["kestrel_pd_handoffs_completed_total"] == p0["kestrel_pd_handoffs_completed_total"], m
    # Room 901's client hangs up too: its reservation was advertised, so the decode keeps it until the prefill
    # answers the cancel (it never had the room: a withdrawal), then frees it at once, not quarantined.
    holder.close()
    t0 = time.time()
    d, ok = nothing_held(decode)
    assert ok, d
    wait_until(lambda: decode.metrics()["kestrel_pd_handoffs_in_flight"] == 0, "decode hand-off still in flight", 20)
    d = decode.metrics()
    assert time.time() - t0 < 20
    assert d["kestrel_pd_quarantined_handoffs"] == 0, d
    assert d["kestrel_pd_handoffs_cancelled_total"] - d0["kestrel_pd_handoffs_cancelled_total"] == 2, d
    assert d["kestrel_pd_handoffs_withdrawn_total"] - d0["kestrel_pd_handoffs_withdrawn_total"] == 1, d
    assert d["kestrel_pd_handoffs_completed_total"] == d0["kestrel_pd_handoffs_completed_total"], d
    # The pair still works: both legs of room 903, the decode's stream read to its end.
    p_leg = open_leg(prefill, prefill, 903, "Hi", 4)
    d_leg = open_leg(decode, prefill, 903, "Hi", 4)
    r = d_leg.getresponse()
    assert r.status == 200
    assert b"[DONE]" in r.read()
    p_leg.getresponse().read()
    for s in (prefill, decode):
        m, ok = nothing_held(s)
        assert ok, (s.base, m)


def failed_total(m):
    return sum(v for k, v in m.items() if k.startswith("kestrel_pd_handoffs_failed_total"))


@pytest.mark.parametrize("tls", ["tcp", "shm"])
def test_sigterm_decode_calls_off_its_handoffs(tls):
    """SIGTERM to a decode worker (no drain time) while its reservation for room 911 is advertised and the prefill
    still computes that room's long prompt: the decode's cancel reaches the prefill, which cancels the request;
    without it the prefill would finish the prompt, park it and fail the transfer to a decode that is gone."""
    env = {"UCX_TLS": tls}
    # Chunks of 8 tokens: the prompt (about 1,400 tokens) takes about 2 s on the test machine, the decode's
    # reservation is advertised within a fraction of that.
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", DEADLINE_MS, "--prefill-chunk", "8"],
                     env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", DEADLINE_MS, "--drain-seconds", "0"], env=env)
    try:
        p0 = prefill.metrics()
        p_leg = open_leg(prefill, prefill, 911, LONG, 16)
        d_leg = open_leg(decode, prefill, 911, LONG, 16)
        wait_until(lambda: decode.metrics()["kestrel_pd_handoffs_started_total"] == 1, "room 911 never advertised")
        m = prefill.metrics()
        assert m["kestrel_state_slots_used"] == 1 and m["kestrel_pd_handoffs_in_flight"] == 0, \
            ("the prefill's prompt must still run when the decode stops", m)
        assert decode.stop(signal.SIGTERM, timeout=30) == 0, open(decode.log.name).read()
        d_leg.close()
        resp = p_leg.getresponse()
        assert resp.status == 200
        resp.read()  # the prefill's request ended (cancelled), well within the connection's 60 s timeout
        m, ok = nothing_held(prefill)
        assert ok, m
        wait_until(lambda: prefill.metrics()["kestrel_pd_handoffs_in_flight"] == 0, "prefill hand-off in flight", 20)
        m = prefill.metrics()
        assert m["kestrel_pd_cancel_messages_total"] - p0["kestrel_pd_cancel_messages_total"] == 1, m
        assert m["kestrel_pd_handoffs_completed_total"] == p0["kestrel_pd_handoffs_completed_total"], m
        assert failed_total(m) == failed_total(p0), ("the prefill ran the hand-off to a decode that was gone", m)
    finally:
        if decode.proc.poll() is None:
            decode.stop()
        prefill.stop()
