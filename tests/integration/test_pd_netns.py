"""Prefill and decode in two network namespaces joined by a veth pair, the hand-off over UCX_TLS=tcp only (no
loopback, no shared memory between them), behind `sglang-router` (in the decode's namespace):
  - answers equal a colocated server (text, float32 logprobs);
  - a `tc tbf` bandwidth cap on the link (50 Mbit/s; this kernel has no netem): the answer is still exact, the
    hand-off takes about as long as its bytes need at that rate;
  - the link set down in the middle of a (capped, so slow) hand-off: the client gets an error within a bound, no
    hang, and once the link is back neither worker holds a page, a slot or a hand-off; the next request is exact.
The test makes and removes its namespaces itself; it needs root (`ip netns`) and skips, saying so, otherwise."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager

import pytest

from conftest import Server
from test_pd_router import GRID, PROMPTS, chat, post, same_logprobs

if os.geteuid() != 0:
    pytest.skip("test_pd_netns needs root: it creates network namespaces and a veth pair (ip netns)",
                allow_module_level=True)

CLONE_NEWNET = 0x40000000
TAG = "kpd%d" % (os.getpid() % 100000)
NS_P, NS_D = TAG + "p", TAG + "d"
DEV_P, DEV_D = TAG + "vp", TAG + "vd"
SUBNET = "10.%d.%d" % (100 + os.getpid() % 100, (os.getpid() // 100) % 250)
IP_P, IP_D = SUBNET + ".1", SUBNET + ".2"
PORT_P, PORT_D, PORT_R = 18001, 18002, 18000
RATE_MBIT = 50
LONG = "Write a long story about a lighthouse keeper who counts ships, one per line, for a whole winter night. " * 10
_libc = ctypes.CDLL(None, use_errno=True)


def sh(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


@contextmanager
def netns(name):
    """This thread inside the namespace: the sockets it opens meanwhile live there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open("/run/netns/" + name, os.O_RDONLY)
    try:
        assert _libc.setns(target, CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
        yield
    finally:
        assert _libc.setns(own, CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
        os.close(target)
        os.close(own)


def get(ns, url, timeout=5):
    with netns(ns):
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()


def metrics(ns, port):
    _, text = get(ns, "http://127.0.0.1:%d/metrics" % port)
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_http(ns, url, proc, log, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("exited: " + open(log.name).read())
        try:
            if get(ns, url, timeout=1)[0] == 200:
                return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError("not ready: " + open(log.name).read())


def spawn(ns, args, env=None):
    log = tempfile.NamedTemporaryFile(prefix=TAG + "-", suffix=".log", delete=False)
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(env or {})))
    return proc, log


def worker(ns, port, role):
    binary = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
    cache = os.environ.get("KESTREL_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "kestrel-it-cache")
    proc, log = spawn(ns, [binary, "serve", "--quiet", "--host", "0.0.0.0", "--port", str(port), "--cache-mib", "256",
                           "--max-context", "2048", "--preset", "k3-default", *GRID, "--role", role,
                           "--handoff-timeout-ms", "20000"],
                      env={"UCX_TLS": "tcp", "KESTREL_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"})
    wait_http(ns, "http://127.0.0.1:%d/health" % port, proc, log)
    return proc, log


def chat_in(ns, base, prompt, max_tokens=8, timeout=120):
    with netns(ns):
        return post(base, {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 3},
                    timeout=timeout)


@pytest.fixture(scope="module")
def colocated():
    s = Server(GRID)
    yield s
    s.stop()


# The workers of `pair`, by role: the link-down test checks that both survived.
WORKERS = {}


@pytest.fixture(scope="module")
def pair():
    procs = []
    try:
        sh("ip", "netns", "add", NS_P)
        sh("ip", "netns", "add", NS_D)
        sh("ip", "link", "add", DEV_P, "type", "veth", "peer", "name", DEV_D)
        sh("ip", "link", "set", DEV_P, "netns", NS_P)
        sh("ip", "link", "set", DEV_D, "netns", NS_D)
        for ns, dev, ip in ((NS_P, DEV_P, IP_P), (NS_D, DEV_D, IP_D)):
            sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        procs.append(worker(NS_P, PORT_P, "prefill"))
        procs.append(worker(NS_D, PORT_D, "decode"))
        WORKERS["prefill"], WORKERS["decode"] = procs[0][0], procs[1][0]
        router = spawn(NS_D, [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                              "--prefill", "http://%s:%d" % (IP_P, PORT_P), str(PORT_P),
                              "--decode", "http://%s:%d" % (IP_D, PORT_D), "--host", IP_D, "--port", str(PORT_R),
                              "--retry-max-retries", "1", "--health-check-interval-secs", "1",
                              "--prometheus-port", "29100"])
        procs.append(router)
        wait_http(NS_D, "http://%s:%d/readiness" % (IP_D, PORT_R), *router, limit=60)
        yield "http://%s:%d" % (IP_D, PORT_R)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for ns in (NS_P, NS_D):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def settled(ns, port, timeout=30):
    deadline = time.time() + timeout
    while True:
        m = metrics(ns, port)
        held = (m["kestrel_kv_blocks_used"], m["kestrel_state_slots_used"], m["kestrel_requests_running"],
                m["kestrel_requests_waiting"], m["kestrel_pd_handoffs_in_flight"],
                m.get("kestrel_pd_quarantined_handoffs", 0), m.get("kestrel_pd_registry_held_ranges", 0))
        if held == (0,) * 7 or time.time() > deadline:
            return m, held == (0,) * 7
        time.sleep(0.1)


def test_tcp_across_namespaces_equals_colocated(pair, colocated):
    for prompt in PROMPTS:
        s1, want = chat(colocated.base, prompt)
        s2, got = chat_in(NS_D, pair, prompt)
        assert s1 == 200 and s2 == 200, (want, got)
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert same_logprobs(got, want), prompt
    d = metrics(NS_D, PORT_D)
    assert d["kestrel_pd_handoffs_completed_total"] == len(PROMPTS), d
    assert d['kestrel_pd_handoffs_failed_total{reason="peer"}'] == 0, d


def handoff_seconds():
    """The prefill's hand-off time (parked → completion sent: the transfer, not the prompt) and bytes so far."""
    m = metrics(NS_P, PORT_P)
    return m["kestrel_pd_handoff_seconds_sum"], m["kestrel_pd_transfer_bytes_total"]


def test_bandwidth_cap_slower_but_exact(pair, colocated):
    s, want = chat(colocated.base, LONG, 4)
    assert s == 200, want
    t0, b0 = handoff_seconds()
    s, got = chat_in(NS_D, pair, LONG, 4)
    assert s == 200, got
    t1, b1 = handoff_seconds()
    sh("ip", "netns", "exec", NS_P, "tc", "qdisc", "add", "dev", DEV_P, "root", "tbf", "rate", "%dmbit" % RATE_MBIT,
       "burst", "32kbit", "latency", "400ms")
    try:
        s, capped = chat_in(NS_D, pair, LONG, 4)
        assert s == 200, capped
        t2, b2 = handoff_seconds()
    finally:
        sh("ip", "netns", "exec", NS_P, "tc", "qdisc", "del", "dev", DEV_P, "root")
    for out in (got, capped):
        assert out["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert same_logprobs(out, want)
    nbytes = b2 - b1
    assert nbytes == b1 - b0 and nbytes > 4e6, (nbytes, b1 - b0)
    at_rate = nbytes * 8 / (RATE_MBIT * 1e6)
    # The capped hand-off needs (nearly) the time its bytes take at the cap, the uncapped one much less.
    print("netns hand-off of %d bytes: %.3f s uncapped, %.3f s capped at %d Mbit/s (%.3f s at the rate)" % (
        nbytes, t1 - t0, t2 - t1, RATE_MBIT, at_rate))
    assert t2 - t1 > 0.8 * at_rate, (t2 - t1, at_rate)
    assert t1 - t0 < 0.5 * at_rate, (t1 - t0, at_rate)


def failed(m):
    return sum(v for k, v in m.items() if k.startswith("kestrel_pd_handoffs_failed_total"))


def test_link_down_mid_transfer_fails_cleanly(pair, colocated):
    # Over tcp the decode connects to the prefill's UCX listener: a forced close while the link is down frees the
    # tcp endpoint at once (docs/disaggregation.md, "Link down over tcp"). Connected by worker address the prefill
    # died with SIGSEGV inside UCX 1.13 about once in 70 runs after the link came back; any crash fails the test.
    try:
        link_down_mid_transfer(pair, colocated)
    finally:
        for role, proc in WORKERS.items():
            rc = proc.poll()
            assert rc is None, "the %s worker died (exit status %s) around the link-down" % (role, rc)


def link_down_mid_transfer(pair, colocated):
    s, want = chat(colocated.base, LONG, 4)
    assert s == 200, want
    p0, d0 = failed(metrics(NS_P, PORT_P)), failed(metrics(NS_D, PORT_D))
    # A capped link makes the hand-off take about a second: the link goes down while it runs.
    sh("ip", "netns", "exec", NS_P, "tc", "qdisc", "add", "dev", DEV_P, "root", "tbf", "rate", "%dmbit" % RATE_MBIT,
       "burst", "32kbit", "latency", "400ms")
    result = {}

    def client():
        t = time.time()
        try:
            result["status"], result["body"] = chat_in(NS_D, pair, LONG, 4, timeout=90)
        except Exception as e:  # a dropped connection is a clear error too; a hang is not
            result["status"], result["body"] = None, repr(e)
        result["seconds"] = time.time() - t

    th = threading.Thread(target=client)
    th.start()
    link_down = False
    try:
        deadline = time.time() + 60
        while time.time() < deadline and metrics(NS_P, PORT_P)["kestrel_pd_handoffs_in_flight"] == 0:
            time.sleep(0.01)
        assert metrics(NS_P, PORT_P)["kestrel_pd_handoffs_in_flight"] == 1, "the hand-off never started"
        time.sleep(0.2)  # the puts are under way
        sh("ip", "-n", NS_P, "link", "set", DEV_P, "down")
        link_down = True
        # While the link is still down, both sides give the hand-off up on their own (decode: the prefill falls
        # silent; prefill: the decode's lease runs out) and free its memory: no recovery of the link needed.
        for ns, port, before in ((NS_P, PORT_P, p0), (NS_D, PORT_D, d0)):
            until = time.time() + 15
            while time.time() < until and failed(metrics(ns, port)) == before:
                time.sleep(0.1)
            m, ok = settled(ns, port, timeout=15)
            assert failed(m) > before, (ns, m)
            assert ok, (ns, m)
    finally:
        if link_down:
            sh("ip", "-n", NS_P, "link", "set", DEV_P, "up")
        sh("ip", "netns", "exec", NS_P, "tc", "qdisc", "del", "dev", DEV_P, "root")
        th.join(timeout=100)
    assert not th.is_alive(), "the client hung"
    assert result["seconds"] < 90, result
    # The client got a clear error, or (the router retried once the link was back) the exact answer.
    if result["status"] == 200:
        assert result["body"]["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert same_logprobs(result["body"], want)
    for ns, port in ((NS_P, PORT_P), (NS_D, PORT_D)):
        m, ok = settled(ns, port)
        assert ok, (ns, m)
    # The link is back: the decode instance connects again and the answer is exact.
    s, want = chat(colocated.base, PROMPTS[0])
    s2, got = chat_in(NS_D, pair, PROMPTS[0])
    assert s == 200 and s2 == 200, got
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert same_logprobs(got, want)
