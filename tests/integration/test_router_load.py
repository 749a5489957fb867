"""`GET /get_load`, SGLang's load report, which sglang-router's load-aware policies poll: one entry (dp_rank 0)
with num_reqs, num_waiting_reqs, num_tokens (the tokens the cache holds for running sequences plus the tokens the
waiting requests must feed) and num_pending_tokens (the latter alone). Checked on an idle server, with one stream
running and a second request waiting behind it (`--max-running 1`), and through sglang-router 0.3.2 itself
(`--policy power_of_two` over two servers): the router's `/get_loads` reports each worker's num_tokens."""
import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.request

from conftest import Server, free_port
from test_pd_cancel import nothing_held, wait_until

PAGE = 16
ARGS = ["--page-tokens", str(PAGE), "--max-running", "1", "--no-prefix-cache"]


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


def load(server):
    entries = get_json(server.base + "/get_load")
    assert isinstance(entries, list) and len(entries) == 1, entries
    e = entries[0]
    assert e["dp_rank"] == 0 and isinstance(e["ts_tic"], float), e
    return e


def open_stream(server, prompt, max_tokens):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"model": "kimi-k3", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn


def prompt_tokens(server, prompt):
    req = urllib.request.Request(server.base + "/tokenize", data=json.dumps({"prompt": prompt}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["count"]


def test_get_load_counts_running_and_waiting_tokens():
    s = Server(ARGS)
    try:
        e = load(s)
        assert (e["num_reqs"], e["num_waiting_reqs"], e["num_tokens"], e["num_pending_tokens"]) == (0, 0, 0, 0), e
        first, second = "The lighthouse keeper counted ships " * 3, "Tell me about the sea " * 5
        n_first, n_second = prompt_tokens(s, first), prompt_tokens(s, second)
        a = open_stream(s, first, 400)
        ra = a.getresponse()
        assert ra.status == 200
        ra.read1(1)  # running
        b = open_stream(s, second, 4)  # waits: one sequence at a time
        wait_until(lambda: load(s)["num_waiting_reqs"] == 1, "the second request never waited")
        e = load(s)
        assert e["num_reqs"] == 2 and e["num_pending_tokens"] == n_second, (e, n_second)
        held = e["num_tokens"] - e["num_pending_tokens"]  # pages of the running sequence
        assert held % PAGE == 0 and n_first <= held <= n_first + 400 + PAGE, (e, n_first)
        a.close()
        rb = b.getresponse()
        assert rb.status == 200 and b"[DONE]" in rb.read()
        m, ok = nothing_held(s)
        assert ok, m
        e = load(s)
        assert (e["num_reqs"], e["num_waiting_reqs"], e["num_tokens"], e["num_pending_tokens"]) == (0, 0, 0, 0), e
    finally:
        s.stop()


def test_sglang_router_reads_the_load():
    busy, idle = Server(ARGS), Server(ARGS)
    log = tempfile.NamedTemporaryFile(prefix="sglang-router-", suffix=".log", delete=False)
    port = free_port()
    router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", busy.base,
                               idle.base, "--policy", "power_of_two", "--host", "127.0.0.1", "--port", str(port),
                               "--prometheus-port", str(free_port())], stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"

        def loads():
            try:
                return {w["worker"]: w["load"] for w in get_json(base + "/get_loads")["workers"]}
            except Exception:
                return {}

        wait_until(lambda: len(loads()) == 2, "the router never reported both workers: " + open(log.name).read())
        assert loads() == {busy.base: 0, idle.base: 0}
        conn = open_stream(busy, "The lighthouse keeper counted ships " * 3, 400)
        r = conn.getresponse()
        assert r.status == 200
        r.read1(1)
        deadline = time.time() + 30
        while True:
            seen, own = loads(), load(busy)["num_tokens"]
            if seen.get(busy.base, 0) > 0:
                break
            assert time.time() < deadline, (seen, own)
            time.sleep(0.2)
        assert seen[idle.base] == 0, seen
        assert seen[busy.base] % PAGE == 0 and seen[busy.base] >= PAGE, seen
        conn.close()
    finally:
        router.terminate()
        router.wait(timeout=30)
        busy.stop()
        idle.stop()
