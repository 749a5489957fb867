"""Prefill/decode disaggregation behind the real router: `sglang-router --pd-disaggregation` (PyPI, its Rust
gateway) in front of one `kestrel serve --role prefill` and one `kestrel serve --role decode`, the state moving
over UCX (tcp on loopback, and shared memory). Chat completions through the router give the same text and the same
logprobs (as float32, the engine's precision: the router re-serialises the JSON numbers) as a colocated server;
a decode worker killed with SIGKILL gives the client a clear error within a bound, not a hang, and the prefill
worker ends with nothing held. A decode worker with another model fingerprint is refused with a clear error."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import Server, free_port

GRID = ["--page-tokens", "16", "--prefill-chunk", "32", "--no-prefix-cache"]
PROMPTS = ["Tell me about the sea", "Hi",
           "Write a long story about a lighthouse keeper who counts ships, one per line, for a whole winter night."]


def post(base, body, timeout=120):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def chat(base, prompt, max_tokens=8):
    return post(base, {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "logprobs": True, "top_logprobs": 3})


def f32(x):
    return np.float32(x).tobytes()


def same_logprobs(a, b):
    la, lb = a["choices"][0]["logprobs"]["content"], b["choices"][0]["logprobs"]["content"]
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if x["token"] != y["token"] or f32(x["logprob"]) != f32(y["logprob"]):
            return False
        if [(t["token"], f32(t["logprob"])) for t in x["top_logprobs"]] != \
                [(t["token"], f32(t["logprob"])) for t in y["top_logprobs"]]:
            return False
    return True


class Router:
    """`prefill` and `decode`: one Server or a list of them; `extra`: more router arguments (a policy).
    Its two ports are picked free by probing, so a server starting beside it (tests run in parallel) can take one
    before the router binds it: a launch that fails with "address in use" is retried on new ports."""
    def __init__(self, prefill, decode, extra=()):
        for attempt in range(3):
            if self._launch(prefill, decode, extra):
                return
        raise RuntimeError("router could not bind its ports: " + open(self.log.name).read())

    def _launch(self, prefill, decode, extra):
        """True when ready; False when the router exited because a port was taken; raises otherwise."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="sglang-router-", suffix=".log", delete=False)
        args = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for p in (prefill if isinstance(prefill, list) else [prefill]):
            args += ["--prefill", p.base, str(p.port)]
        for d in (decode if isinstance(decode, list) else [decode]):
            args += ["--decode", d.base]
        args += ["--host", "127.0.0.1", "--port", str(self.port),
                 "--retry-max-retries", "1", "--health-check-interval-secs", "1",
                 "--prometheus-port", str(free_port()), *extra]  # its default port (29000) may be taken
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        # /health answers before the workers are registered (asynchronously); /readiness once they are.
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                text = open(self.log.name).read()
                if "address already in use" in text.lower() or "addrinuse" in text.lower():
                    return False
                raise RuntimeError("router exited: " + text)
            try:
                with urllib.request.urlopen(self.base + "/readiness", timeout=1) as r:
                    if r.status == 200:
                        return True
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("router did not become ready: " + open(self.log.name).read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def colocated():
    s = Server(GRID)
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["tcp", "shm"])
def pd(request):
    env = {"UCX_TLS": request.param}
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", "5000"], env=env)
    decode = Server(GRID + ["--role", "decode", "--handoff-timeout-ms", "5000"], env=env)
    router = Router(prefill, decode)
    yield prefill, decode, router
    router.stop()
    for s in (prefill, decode):
        if s.proc.poll() is None:
            s.stop()


def test_roles_are_reported_and_direct_requests_are_refused(pd):
    prefill, decode, _ = pd
    for s, role in ((prefill, "prefill"), (decode, "decode")):
        with urllib.request.urlopen(s.base + "/v1/models", timeout=10) as r:
            assert json.loads(r.read())["data"][0]["role"] == role
        status, body = chat(s.base, "Hi")
        assert status == 400 and "bootstrap" in body["error"]["message"], body


def test_router_equals_colocated(pd, colocated):
    _, _, router = pd
    for prompt in PROMPTS:
        status, got = chat(router.base, prompt)
        assert status == 200, got
        _, want = chat(colocated.base, prompt)
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert same_logprobs(got, want), prompt
        assert got["choices"][0]["finish_reason"] == "length"


def test_handoff_metrics(pd):
    """After the parity test's hand-offs (one per prompt): both roles count them, move the same bytes, time each
    one, and hold nothing."""
    prefill, decode, _ = pd
    p, d = prefill.idle_metrics(), decode.idle_metrics()
    n = len(PROMPTS)
    assert p['kestrel_pd_role_info{role="prefill"}'] == 1 and d['kestrel_pd_role_info{role="decode"}'] == 1
    for m in (p, d):
        assert m["kestrel_pd_handoffs_started_total"] == n, m
        assert m["kestrel_pd_handoffs_completed_total"] == n, m
        assert m["kestrel_pd_handoffs_in_flight"] == 0, m
        assert m["kestrel_pd_handoff_seconds_count"] == n and m["kestrel_pd_handoff_seconds_sum"] > 0, m
        assert m['kestrel_pd_handoff_seconds_bucket{le="+Inf"}'] == n, m
        assert sum(v for k, v in m.items() if k.startswith("kestrel_pd_handoffs_failed_total{")) == 0, m
    assert p["kestrel_pd_transfer_bytes_total"] == d["kestrel_pd_transfer_bytes_total"] > 0
    assert d["kestrel_pd_quarantined_handoffs"] == 0 and d["kestrel_pd_quarantined_bytes"] == 0
    assert d["kestrel_pd_registry_held_ranges"] == 0


def test_fingerprint_mismatch_is_refused(pd):
    prefill, _, _ = pd
    other = Server(GRID + ["--role", "decode", "--kv-cache-dtype", "bf16"], env={"UCX_TLS": "tcp"})
    try:
        status, body = post(other.base, {"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}],
                                         "max_tokens": 2, "bootstrap_host": "127.0.0.1",
                                         "bootstrap_port": prefill.port, "bootstrap_room": 77})
        assert status == 400, body
        assert "fingerprint" in body["error"]["message"], body
    finally:
        other.stop()


def test_killed_decode_gives_a_clear_error_and_the_prefill_holds_nothing(pd):
    prefill, decode, router = pd
    decode.proc.send_signal(signal.SIGKILL)
    decode.proc.wait(timeout=10)
    t0 = time.time()
    status, body = chat(router.base, "Tell me about the sea")
    assert time.time() - t0 < 60, "the router hung on a dead decode worker"
    assert status >= 500 and "error" in body, body
    m = prefill.idle_metrics(timeout=30)  # parked requests end at the hand-off deadline
    assert m["kestrel_kv_blocks_used"] == 0 and m["kestrel_state_slots_used"] == 0, m
    deadline = time.time() + 30
    while m["kestrel_pd_handoffs_in_flight"] != 0 and time.time() < deadline:
        time.sleep(0.1)
        m = prefill.metrics()
    assert m["kestrel_pd_handoffs_in_flight"] == 0, m
    assert m['kestrel_pd_handoffs_failed_total{reason="no_destinations"}'] >= 1, m
