"""Abort storm behind `sglang-router --pd-disaggregation`: 200 streaming clients hang up at random phases of their
requests (right after sending it, before the prefill leg has run; while the prompt runs on the prefill; as the
response starts, around the hand-off; after a few streamed tokens, while the decode instance generates), mixed
with requests that run to their end. Afterwards neither worker holds a page, a KDA slot, a running or waiting
request, a hand-off in flight, a quarantined hand-off or an advertised memory range; the requests that were not
aborted have the same text and finish reason as before the storm; and the pair still answers exactly as before.
The hand-off deadline is 40 s: a hang-up that reaches only one worker (the router had not yet passed the request
to the other, which then never asks for or sends the state) is released at that deadline, since there is no
cancel message between the workers; everything else is released by the cancellation itself. A request waiting
in the prefill's queue is not bound by it: during the storm the prefill's queue is long (on 2 vCPUs of a Zen 3
EPYC, AVX2, 86 of 128 hand-offs waited 10-30 s from the decode's reservation to the verified state and 2 waited
30-60 s), and the prefill's queued notices (kQueued) renew the decode's deadline while it holds such a request.
Before them, a run beside other tests failed a request at the deadline."""
import http.client
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import Server
from test_pd_cancel import nothing_held
from test_pd_router import GRID, Router, post

ABORTS = 200
PHASES = ("before_prefill", "during_prefill", "at_handoff", "during_decode")
COMPLETE_PROMPTS = ["Tell me about the sea", "Hi", "Name three ships", "Count to five"]
COMPLETE_MAX_TOKENS = 10
HANDOFF_MS = "40000"
LONG = "Count the ships that pass the lighthouse, one per line, and describe each of them. "


@pytest.fixture(scope="module")
def pd():
    env = {"UCX_TLS": "tcp"}
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", HANDOFF_MS], env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", HANDOFF_MS], env=env)
    router = Router(prefill, decode)
    yield prefill, decode, router
    router.stop()
    for s in (prefill, decode):
        s.stop()


def complete(router, prompt):
    status, body = post(router.base, {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}],
                                      "max_tokens": COMPLETE_MAX_TOKENS, "temperature": 0})
    assert status == 200, body
    choice = body["choices"][0]
    return choice["message"]["content"], choice["finish_reason"], body["usage"]["completion_tokens"]


def abort(router, phase, rng):
    """One streaming request whose client hangs up in `phase`; returns the phase."""
    long_prompt = phase in ("during_prefill", "at_handoff")
    prompt = LONG * rng.randint(3, 8) if long_prompt else "Tell me about ship %d" % rng.randint(0, 10 ** 6)
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": 48,
            "temperature": 0, "stream": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    try:
        if phase == "before_prefill":
            return phase
        if phase == "during_prefill":
            time.sleep(rng.uniform(0.0, 0.2))
            return phase
        resp = conn.getresponse()
        if phase == "at_handoff":
            return phase
        events = rng.randint(1, 4)
        got = b""
        while got.count(b"data:") < events:
            chunk = resp.read1(4096)
            if not chunk:
                break
            got += chunk
        return phase
    finally:
        conn.close()


def test_abort_storm_leaks_nothing(pd):
    prefill, decode, router = pd
    reference = {p: complete(router, p) for p in COMPLETE_PROMPTS}
    for text, reason, n in reference.values():
        assert reason in ("length", "stop") and (reason == "length") == (n == COMPLETE_MAX_TOKENS), (text, reason, n)
    rng = random.Random(1234)
    jobs = [("abort", PHASES[i % len(PHASES)]) for i in range(ABORTS)]
    jobs += [("complete", COMPLETE_PROMPTS[i % len(COMPLETE_PROMPTS)]) for i in range(24)]
    rng.shuffle(jobs)
    seeds = [rng.randrange(1 << 30) for _ in jobs]
    t0 = time.time()

    def one(job, seed):
        kind, what = job
        if kind == "abort":
            return kind, abort(router, what, random.Random(seed)), None
        return kind, what, complete(router, what)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, jobs, seeds))
    storm_s = time.time() - t0
    # A guard against hangs, not a speed target (the storm took 223 s on 2 AVX2-only vCPUs of a Zen 3 EPYC).
    assert storm_s < 450, f"the storm took {storm_s:.0f} s"
    assert sum(1 for k, _, _ in results if k == "abort") == ABORTS
    # The requests that ran to their end: the same text, finish reason and length as without the storm.
    for kind, prompt, got in results:
        if kind == "complete":
            assert got == reference[prompt], (prompt, got, reference[prompt])
    # Nothing held on either side (pages, slots, requests) once the hand-off deadline has passed.
    for name, s in (("prefill", prefill), ("decode", decode)):
        m, ok = nothing_held(s, timeout=60)
        assert ok, (name, {k: v for k, v in m.items() if k.startswith(("kestrel_pd", "kestrel_kv", "kestrel_state",
                                                                         "kestrel_requests"))})
    p, d = prefill.metrics(), decode.metrics()
    print("abort storm: %.1f s; prefill %s; decode %s" % (
        storm_s, {k: v for k, v in p.items() if k.startswith("kestrel_pd_handoffs")},
        {k: v for k, v in d.items() if k.startswith("kestrel_pd_handoffs")}))
    # How close the slowest hand-offs came to the deadline: the decode's wait from its destinations to the verified
    # state (the prefill's queue and prompt included), cumulative counts by upper bound in seconds.
    print("decode hand-off seconds: %s" % {k.split('le="')[1].rstrip('"}'): v for k, v in d.items()
                                           if k.startswith("kestrel_pd_handoff_seconds_bucket")})
    assert p["kestrel_pd_handoffs_in_flight"] == 0, p
    assert d["kestrel_pd_handoffs_in_flight"] == 0, d
    assert d["kestrel_pd_quarantined_handoffs"] == 0 and d["kestrel_pd_quarantined_bytes"] == 0, d
    assert d["kestrel_pd_registry_held_ranges"] == 0, d
    # The hang-ups reached the workers (cancelled there), not only the router.
    assert d["kestrel_requests_cancelled_total"] + p["kestrel_requests_cancelled_total"] >= ABORTS // 4, (p, d)
    # And the pair still answers exactly as before the storm.
    for prompt in COMPLETE_PROMPTS:
        assert complete(router, prompt) == reference[prompt], prompt
